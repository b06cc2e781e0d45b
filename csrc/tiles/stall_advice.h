// What to do when StarPU stalls with a memory node at its limit, read from the nodes' breakdown
// (memory_nodes_tiles): the stall report's advice, also memory_advice() in Python.
#pragma once

#include <string>
#include <vector>

#include "tile_tensor.h"

namespace nntile {

// nodes: memory_nodes_tiles(); has_disk: a disk node is configured; max_window: the submission window's maximum (-1:
// none). Names the nodes at their limit and what fills them: memory outside live tiles (a smaller window bounds it),
// or only copies of live tiles on every node (the data does not fit with room to move: a disk node or less data).
std::string stall_advice(const std::vector<NodeTiles> &nodes, bool has_disk, int max_window);
// The same for the running runtime's nodes, disk node and window.
std::string stall_advice_now();

}  // namespace nntile
