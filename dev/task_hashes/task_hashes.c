/* Per-task hashes of what each nntile task read and wrote, for finding the first task where two runs of the same
 * program part ways (issue 35: a training run under eviction that is rarely not bit-identical).
 *
 * An LD_PRELOAD library: it wraps starpu_task_submit (libstarpu calls it through its PLT, from starpu_task_insert)
 * and starpu_vector_data_register. Each task of an nntile codelet (perf model "nntile_*") gets its submission index,
 * which is the same in every run of the same program (Python submits from one thread in program order), and runs
 * through a wrapper of the codelet's CPU function that hashes (FNV-1a) every buffer it reads before the function and
 * every buffer it writes after it. It also records, per input, the index of the task that last wrote that handle
 * before it was submitted (-1: written by the host, from_dense), so a differing input can be traced to its producer.
 * At exit it writes one line per executed task to $TASK_HASHES_OUT(.<pid> with TASK_HASHES_PID=1):
 *   <index> <worker> <name> mxcsr=<hex> <in>/<out>/<producer> ...   (one triple per buffer; 0 where not read/written)
 * CPU workers only (CUDA functions are not wrapped). Build and use: dev/task_hashes/repeat.py. */
#define _GNU_SOURCE
#define STARPU_DONT_INCLUDE_CUDA_HEADERS
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <starpu.h>

#define MAX_CODELETS 256
#define MAX_RECORDS 4000000
#define MAX_BUFFERS 6
#define TABLE_SIZE (1 << 20) /* open addressing, keyed by pointer */

struct record {
    long index;
    int worker;
    unsigned mxcsr;
    char name[24];
    int nbuffers;
    uint64_t in[MAX_BUFFERS], out[MAX_BUFFERS];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { struct starpu_codelet *original, *wrapped; } codelets[MAX_CODELETS];
static int ncodelets;
static long submitted;
static struct record *records;
static long nrecords;
static long (*producers)[MAX_BUFFERS]; /* by task index */

/* task -> index; handle -> index of its last writer */
static const void *task_keys[TABLE_SIZE], *handle_keys[TABLE_SIZE];
static long task_values[TABLE_SIZE], handle_values[TABLE_SIZE];

static long *slot(const void **keys, long *values, const void *key, long fresh) {
    size_t i = ((uintptr_t)key >> 4) & (TABLE_SIZE - 1);
    while (keys[i] && keys[i] != key) i = (i + 1) & (TABLE_SIZE - 1);
    if (!keys[i]) {
        keys[i] = key;
        values[i] = fresh;
    }
    return &values[i];
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* libstarpu is loaded by nntile_torch._C with RTLD_LOCAL: look its symbols up in it, not with RTLD_NEXT */
static void *starpu_symbol(const char *name) {
    static void *lib;
    if (!lib) lib = dlopen("libstarpu-1.3.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libstarpu-1.4.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *f = lib ? dlsym(lib, name) : NULL;
    if (!f) {
        fprintf(stderr, "task_hashes: %s not found in the loaded libstarpu\n", name);
        abort();
    }
    return f;
}

static uint64_t hash_buffer(void *buffer) {
    return fnv1a((const unsigned char *)STARPU_VECTOR_GET_PTR(buffer),
                 (size_t)STARPU_VECTOR_GET_NX(buffer) * STARPU_VECTOR_GET_ELEMSIZE(buffer));
}

static void wrapper(void *buffers[], void *arg) {
    static struct starpu_task *(*current)(void);
    static int (*worker_id)(void);
    if (!current) {
        current = starpu_symbol("starpu_task_get_current");
        worker_id = starpu_symbol("starpu_worker_get_id");
    }
    struct starpu_task *task = current();
    starpu_cpu_func_t original = NULL;
    struct record r;
    memset(&r, 0, sizeof r);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < ncodelets; i++)
        if (codelets[i].wrapped == task->cl) original = codelets[i].original->cpu_funcs[0];
    r.index = *slot(task_keys, task_values, task, -1);
    pthread_mutex_unlock(&lock);
    r.worker = worker_id();
    r.mxcsr = _mm_getcsr();
    r.nbuffers = STARPU_TASK_GET_NBUFFERS(task);
    snprintf(r.name, sizeof r.name, "%s", task->name ? task->name : "?");
    for (int i = 0; i < r.nbuffers && i < MAX_BUFFERS; i++)
        if (STARPU_TASK_GET_MODE(task, i) & STARPU_R) r.in[i] = hash_buffer(buffers[i]);
    original(buffers, arg);
    for (int i = 0; i < r.nbuffers && i < MAX_BUFFERS; i++)
        if (STARPU_TASK_GET_MODE(task, i) & STARPU_W) r.out[i] = hash_buffer(buffers[i]);
    pthread_mutex_lock(&lock);
    if (nrecords < MAX_RECORDS) records[nrecords++] = r;
    pthread_mutex_unlock(&lock);
}

int starpu_task_submit(struct starpu_task *task) {
    static int (*real)(struct starpu_task *);
    if (!real) real = starpu_symbol("starpu_task_submit");
    struct starpu_codelet *cl = task->cl;
    if (cl && cl->cpu_funcs[0] && cl->model && cl->model->symbol && !strncmp(cl->model->symbol, "nntile_", 7)) {
        pthread_mutex_lock(&lock);
        if (!records) {
            records = calloc(MAX_RECORDS, sizeof *records);
            producers = calloc(MAX_RECORDS, sizeof *producers);
        }
        struct starpu_codelet *wrapped = NULL;
        for (int i = 0; i < ncodelets && !wrapped; i++)
            if (codelets[i].original == cl || codelets[i].wrapped == cl) wrapped = codelets[i].wrapped;
        if (!wrapped && ncodelets < MAX_CODELETS) {
            wrapped = malloc(sizeof *wrapped);
            memcpy(wrapped, cl, sizeof *wrapped);
            wrapped->cpu_funcs[0] = wrapper;
            wrapped->cpu_funcs_name[0] = NULL;
            codelets[ncodelets].original = cl;
            codelets[ncodelets].wrapped = wrapped;
            ncodelets++;
        }
        long index = submitted++;
        *slot(task_keys, task_values, task, index) = index;
        for (int i = 0; i < (int)STARPU_TASK_GET_NBUFFERS(task) && i < MAX_BUFFERS; i++) {
            long *last_writer = slot(handle_keys, handle_values, STARPU_TASK_GET_HANDLE(task, i), -1);
            enum starpu_data_access_mode mode = STARPU_TASK_GET_MODE(task, i);
            if (index < MAX_RECORDS) producers[index][i] = (mode & STARPU_R) ? *last_writer : -2;
            if (mode & STARPU_W) *last_writer = index;
        }
        pthread_mutex_unlock(&lock);
        if (wrapped) task->cl = wrapped;
    }
    return real(task);
}

void starpu_vector_data_register(starpu_data_handle_t *handle, int home_node, uintptr_t ptr, uint32_t nx,
                                 size_t elemsize) {
    static void (*real)(starpu_data_handle_t *, int, uintptr_t, uint32_t, size_t);
    if (!real) real = starpu_symbol("starpu_vector_data_register");
    real(handle, home_node, ptr, nx, elemsize);
    pthread_mutex_lock(&lock);
    *slot(handle_keys, handle_values, *handle, -1) = -1; /* a new handle (maybe at a dead one's address) */
    pthread_mutex_unlock(&lock);
}

__attribute__((destructor)) static void write_records(void) {
    const char *out = getenv("TASK_HASHES_OUT");
    char path[4096];
    if (!out || !records) return;
    if (getenv("TASK_HASHES_PID")) {
        snprintf(path, sizeof path, "%s.%d", out, (int)getpid());
        out = path;
    }
    FILE *f = fopen(out, "w");
    if (!f) return;
    for (long i = 0; i < nrecords; i++) {
        const struct record *r = &records[i];
        fprintf(f, "%ld %d %s mxcsr=%x", r->index, r->worker, r->name, r->mxcsr);
        for (int j = 0; j < r->nbuffers && j < MAX_BUFFERS; j++)
            fprintf(f, " %016llx/%016llx/%ld", (unsigned long long)r->in[j], (unsigned long long)r->out[j],
                    r->index >= 0 && r->index < MAX_RECORDS ? producers[r->index][j] : -3);
        fprintf(f, "\n");
    }
    fclose(f);
}
