/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for tests and the local lab (no GPU, no driver needed).
 *
 * Why C and why the real header: nvidia-ml-py (module pynvml) loads "libnvidia-ml.so.1" with ctypes and calls
 * the C ABI directly. Compiling this file against NVIDIA's own nvml.h (pip package nvidia-nvml-dev, never copied
 * into the repo) with -Werror makes any exported signature that drifts from NVIDIA's a build error, so the Python
 * side is exercised through the same structs, return codes and symbol names it meets on a real node.
 *
 * Build (deploy/local/fake_nvml.py does this):
 *   gcc -std=c11 -D_GNU_SOURCE -shared -fPIC -O2 -Wall -Wextra -Werror -I<dir of nvml.h> \
 *       -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 * With -DFAKE_NVML_OLD_DRIVER the library lacks nvmlDeviceGetCurrentClocksEventReasons and
 * nvmlDeviceGetTemperatureV, like drivers older than those APIs.
 *
 * Driving it: the text file named by $FAKE_NVML_STATE is re-read on EVERY call, so a test or the lab's fault
 * injector changes what the next call sees by appending a line. Later lines override earlier ones. If
 * $FAKE_NVML_TRACE is set, every call appends "<function> [gpu=N] rc=<nvmlReturn_t>" to that file.
 * The grammar (one directive a line, '#' starts a comment; numbers accept 0x... hex):
 *
 *   host NAME                      seeds GPU UUIDs and PCI bus ids so every node's GPUs differ
 *   driver 550.54.15               nvmlSystemGetDriverVersion (NVML version is "12.<driver>")
 *   count 4                        number of GPUs (at most FAKE_MAX_GPUS)
 *   init_error 9                   nvmlInit* returns this code (9 = NVML_ERROR_DRIVER_NOT_LOADED)
 *   gpu N temp C | util GPU MEM | mem_used B | mem_total B | power_mw MW | pcie_replay K
 *   gpu N ecc_unc_vol K | ecc_unc_agg K | ecc_cor_vol K | ecc_cor_agg K
 *   gpu N clocks_event MASK | retired_pending 0/1 | remap CORR UNC PENDING FAILURE
 *   gpu N retired_sbe K | retired_dbe K  pages retired per cause (nvmlDeviceGetRetiredPages[_v2]; K <= 512)
 *   gpu N sm_clock MHZ | sm_clock_max MHZ  nvmlDeviceGetClockInfo / GetMaxClockInfo for SM and graphics
 *                                  (defaults 1980/1980, an H100 SXM at boost; memory 2619, video 1755)
 *   gpu N nvlinks K                number of NVLinks (0 = NVLink calls return NOT_SUPPORTED; default 18)
 *   gpu N nvlink L replay|recovery|crc_flit|crc_data|ecc_data K
 *   gpu N events_supported MASK    nvmlDeviceGetSupportedEventTypes (default 0xC1F)
 *   gpu N recovery_action K        nvmlDeviceGetFieldValues' NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (default 0 = none;
 *                                  any number, so a value newer than pynvml can be tested). Every other field id
 *                                  answers NOT_SUPPORTED in its own nvmlReturn, as a driver without it does
 *   gpu N recovery_action_rc RC    that field's own nvmlReturn (3 = NOT_SUPPORTED: a driver before R570)
 *   gpu N name TEXT...             product name (rest of the line)
 *   gpu N lost 1                   every per-device call returns NVML_ERROR_GPU_IS_LOST (15), including
 *                                  nvmlDeviceGetHandleByIndex_v2 and nvmlDeviceGetIndex, as nvml.h documents
 *   gpu N fail FUNCTION RC         that per-device function returns RC for GPU N (RC 0 removes the fault)
 *   xid N CODE                     event log: an XID critical error (nvmlEventTypeXidCriticalError, data CODE)
 *   event N MASK DATA              event log: any nvmlEventType mask with its eventData
 *
 * A line the parser does not understand makes every call fail with NVML_ERROR_UNKNOWN (and is named in the
 * trace): a typo in a test or an injection must be loud, not silently ignored.
 *
 * Event semantics (deliberately different from real NVML, documented here and in gpu-signals.md):
 *   - Each new event set REPLAYS THE EVENT LOG FROM THE START. Real NVML delivers only events raised after
 *     registration; replaying keeps tests deterministic (an event written before the waiter registered is not
 *     lost to a race). Consumers must therefore de-duplicate per event set lifetime, which NvmlSource does by
 *     keeping one event set open for the life of the source.
 *   - Replacing the state file (a new inode, as write_initial_state's atomic rename does) or truncating it
 *     starts a new event log: existing sets then read the new log from its first line.
 *   - Events are delivered only for registered devices and registered type masks; events not matching are
 *     skipped for good. Delivered events carry gpuInstanceId = computeInstanceId = 0xFFFFFFFF (no MIG).
 *   - nvmlEventSetWait_v2 first delivers pending events, then returns NVML_ERROR_GPU_IS_LOST while any
 *     registered GPU is lost (as nvml.h documents), otherwise polls the state file until timeoutms passes.
 *   - One thread waits on a given event set at a time (as with real NVML usage); sets are independent.
 */

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nvml.h>

#define FAKE_MAX_GPUS 16
#define FAKE_MAX_EVENTS 1024
#define FAKE_MAX_FAILS 16
#define FAKE_NVLINK_COUNTERS 5
#define FAKE_DEFAULT_NVLINKS 18
#define FAKE_MAX_TOKENS 8
#define FAKE_POLL_NS 5000000L /* event wait re-reads the state file every 5 ms */
#define FAKE_MAX_RETIRED 512   /* retired pages per cause; real GPUs stop near 64 */
#define FAKE_MEM_CLOCK_MHZ 2619U
#define FAKE_VIDEO_CLOCK_MHZ 1755U
#define FAKE_SM_CLOCK_MHZ 1980U
#define FAKE_DEFAULT_EVENTS                                                                                        \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |                       \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypeDramRetirementEvent |                      \
     nvmlEventTypeDramRetirementFailure)

/* The header only declares these as opaque pointers; the fake defines them. Handles are stable static
 * addresses, which is what lets a caller map nvmlEventData_t.device back to an index by address. */
struct nvmlDevice_st {
    unsigned char reserved;
};

struct nvmlEventSet_st {
    unsigned long long mask[FAKE_MAX_GPUS]; /* registered event types per GPU */
    size_t next;                            /* replay position in the event log */
    int positioned;                         /* next refers to the log in file (log_dev, log_ino) */
    unsigned long long log_dev, log_ino;
};

static struct nvmlDevice_st g_devices[FAKE_MAX_GPUS];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount; /* nvmlInit* minus nvmlShutdown, as in real NVML */

typedef struct {
    char fn[64];
    nvmlReturn_t rc;
} fake_fail;

typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int temp, util_gpu, util_mem, power_mw, pcie_replay, nvlinks, remap[4];
    unsigned int retired[NVML_PAGE_RETIREMENT_CAUSE_COUNT], sm_clock, sm_clock_max, recovery_action,
        recovery_action_rc;
    int retired_pending, lost, nfails;
    unsigned long long mem_used, mem_total, clocks_event, events_supported;
    unsigned long long ecc[NVML_MEMORY_ERROR_TYPE_COUNT][NVML_ECC_COUNTER_TYPE_COUNT];
    unsigned long long nvlink_err[NVML_NVLINK_MAX_LINKS][FAKE_NVLINK_COUNTERS];
    fake_fail fails[FAKE_MAX_FAILS];
} fake_gpu;

typedef struct {
    unsigned int gpu;
    unsigned long long type, data;
} fake_event;

typedef struct {
    char host[128];
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    unsigned int count;
    nvmlReturn_t init_error;
    fake_gpu gpu[FAKE_MAX_GPUS];
    unsigned long long dev, ino; /* identity of the state file: a rewritten file is a new event log */
    size_t nevents;
    fake_event events[FAKE_MAX_EVENTS];
    char bad_line[160]; /* first line the parser rejected, for the trace */
} fake_state;

/* One NVML call in progress: the state it read and, for per-device calls, the device. */
typedef struct {
    const char *fn;
    fake_state *st;
    fake_gpu *gpu;
    unsigned int idx;
    int has_idx;
} fake_call;

/* ---------------------------------------------------------------- tracing */

static void trace_line(const char *line) {
    const char *path = getenv("FAKE_NVML_TRACE");
    if (path == NULL || *path == '\0') {
        return;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return;
    }
    /* One write() of one short line on an O_APPEND descriptor: lines from concurrent threads never interleave. */
    ssize_t written = write(fd, line, strlen(line));
    (void)written;
    close(fd);
}

static void trace_call(const fake_call *c, nvmlReturn_t rc) {
    char line[256];
    if (c->st != NULL && c->st->bad_line[0] != '\0') {
        snprintf(line, sizeof line, "%s state-error: bad line: %s\n", c->fn, c->st->bad_line);
        trace_line(line);
    }
    if (c->has_idx) {
        snprintf(line, sizeof line, "%s gpu=%u rc=%d\n", c->fn, c->idx, (int)rc);
    } else {
        snprintf(line, sizeof line, "%s rc=%d\n", c->fn, (int)rc);
    }
    trace_line(line);
}

/* ---------------------------------------------------------------- state file */

static int parse_u64(const char *s, unsigned long long *out) {
    if (s == NULL || *s == '\0' || *s == '-') {
        return 0;
    }
    char *end = NULL;
    *out = strtoull(s, &end, 0);
    return end != NULL && *end == '\0';
}

static int parse_u32(const char *s, unsigned int *out) {
    unsigned long long v;
    if (!parse_u64(s, &v) || v > 0xFFFFFFFFULL) {
        return 0;
    }
    *out = (unsigned int)v;
    return 1;
}

static int nvlink_counter(const char *name) {
    static const char *const names[FAKE_NVLINK_COUNTERS] = {"replay", "recovery", "crc_flit", "crc_data",
                                                            "ecc_data"};
    for (int i = 0; i < FAKE_NVLINK_COUNTERS; i++) {
        if (strcmp(name, names[i]) == 0) {
            return i; /* same order as nvmlNvLinkErrorCounter_t */
        }
    }
    return -1;
}

static void set_defaults(fake_state *st) {
    memset(st, 0, sizeof *st);
    snprintf(st->driver, sizeof st->driver, "%s", "550.54.15");
    for (int i = 0; i < FAKE_MAX_GPUS; i++) {
        fake_gpu *g = &st->gpu[i];
        snprintf(g->name, sizeof g->name, "%s", "NVIDIA H100 80GB HBM3");
        g->temp = 40;
        g->power_mw = 70000;
        g->mem_total = 85520809984ULL; /* what an H100 80GB reports */
        g->nvlinks = FAKE_DEFAULT_NVLINKS;
        g->sm_clock = FAKE_SM_CLOCK_MHZ;
        g->sm_clock_max = FAKE_SM_CLOCK_MHZ;
        g->events_supported = FAKE_DEFAULT_EVENTS;
    }
}

/* Applies one "gpu N FIELD ..." directive; returns 0 when the line is malformed. */
static int parse_gpu_field(fake_gpu *g, char **tok, int ntok, const char *name) {
    const char *f = tok[2];
    unsigned long long v = 0;
    if (strcmp(f, "name") == 0) {
        size_t len = name != NULL ? strlen(name) : 0;
        while (len > 0 && (name[len - 1] == ' ' || name[len - 1] == '\t')) {
            len--; /* trailing blanks are not part of the product name */
        }
        if (len == 0 || len >= sizeof g->name) {
            return 0;
        }
        memcpy(g->name, name, len);
        g->name[len] = '\0';
        return 1;
    }
    if (strcmp(f, "util") == 0) {
        return ntok == 5 && parse_u32(tok[3], &g->util_gpu) && parse_u32(tok[4], &g->util_mem);
    }
    if (strcmp(f, "remap") == 0) {
        return ntok == 7 && parse_u32(tok[3], &g->remap[0]) && parse_u32(tok[4], &g->remap[1]) &&
               parse_u32(tok[5], &g->remap[2]) && parse_u32(tok[6], &g->remap[3]);
    }
    if (strcmp(f, "nvlink") == 0) {
        unsigned int link;
        int ctr = ntok == 6 ? nvlink_counter(tok[4]) : -1;
        if (ctr < 0 || !parse_u32(tok[3], &link) || link >= NVML_NVLINK_MAX_LINKS || !parse_u64(tok[5], &v)) {
            return 0;
        }
        g->nvlink_err[link][ctr] = v;
        return 1;
    }
    if (strcmp(f, "fail") == 0) {
        unsigned int rc;
        if (ntok != 5 || strlen(tok[3]) >= sizeof g->fails[0].fn || !parse_u32(tok[4], &rc)) {
            return 0;
        }
        for (int i = 0; i < g->nfails; i++) {
            if (strcmp(g->fails[i].fn, tok[3]) == 0) {
                g->fails[i].rc = (nvmlReturn_t)rc;
                return 1;
            }
        }
        if (g->nfails >= FAKE_MAX_FAILS) {
            return 0;
        }
        snprintf(g->fails[g->nfails].fn, sizeof g->fails[0].fn, "%s", tok[3]);
        g->fails[g->nfails++].rc = (nvmlReturn_t)rc;
        return 1;
    }
    if (ntok != 4 || !parse_u64(tok[3], &v)) {
        return 0;
    }
    if (strcmp(f, "temp") == 0) {
        g->temp = (unsigned int)v;
    } else if (strcmp(f, "mem_used") == 0) {
        g->mem_used = v;
    } else if (strcmp(f, "mem_total") == 0) {
        g->mem_total = v;
    } else if (strcmp(f, "power_mw") == 0) {
        g->power_mw = (unsigned int)v;
    } else if (strcmp(f, "pcie_replay") == 0) {
        g->pcie_replay = (unsigned int)v;
    } else if (strcmp(f, "ecc_unc_vol") == 0) {
        g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_VOLATILE_ECC] = v;
    } else if (strcmp(f, "ecc_unc_agg") == 0) {
        g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_AGGREGATE_ECC] = v;
    } else if (strcmp(f, "ecc_cor_vol") == 0) {
        g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_VOLATILE_ECC] = v;
    } else if (strcmp(f, "ecc_cor_agg") == 0) {
        g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_AGGREGATE_ECC] = v;
    } else if (strcmp(f, "clocks_event") == 0) {
        g->clocks_event = v;
    } else if (strcmp(f, "retired_pending") == 0) {
        g->retired_pending = v != 0;
    } else if (strcmp(f, "retired_sbe") == 0 && v <= FAKE_MAX_RETIRED) {
        g->retired[NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS] = (unsigned int)v;
    } else if (strcmp(f, "retired_dbe") == 0 && v <= FAKE_MAX_RETIRED) {
        g->retired[NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR] = (unsigned int)v;
    } else if (strcmp(f, "sm_clock") == 0 && v <= 0xFFFFFFFFULL) {
        g->sm_clock = (unsigned int)v;
    } else if (strcmp(f, "sm_clock_max") == 0 && v <= 0xFFFFFFFFULL) {
        g->sm_clock_max = (unsigned int)v;
    } else if (strcmp(f, "nvlinks") == 0 && v <= NVML_NVLINK_MAX_LINKS) {
        g->nvlinks = (unsigned int)v;
    } else if (strcmp(f, "events_supported") == 0) {
        g->events_supported = v;
    } else if (strcmp(f, "lost") == 0) {
        g->lost = v != 0;
    } else if (strcmp(f, "recovery_action") == 0 && v <= 0xFFFFFFFFULL) {
        g->recovery_action = (unsigned int)v;
    } else if (strcmp(f, "recovery_action_rc") == 0 && v <= 0xFFFFFFFFULL) {
        g->recovery_action_rc = (unsigned int)v;
    } else {
        return 0;
    }
    return 1;
}

static int add_event(fake_state *st, const char *gpu, const char *type, const char *data) {
    unsigned int idx;
    fake_event *e = &st->events[st->nevents];
    if (st->nevents >= FAKE_MAX_EVENTS || !parse_u32(gpu, &idx) || idx >= FAKE_MAX_GPUS ||
        !parse_u64(type, &e->type) || !parse_u64(data, &e->data)) {
        return 0;
    }
    e->gpu = idx;
    st->nevents++;
    return 1;
}

/* Applies one line; returns 0 when the line is malformed or unknown. */
static int parse_line(fake_state *st, char *line) {
    line[strcspn(line, "#\r\n")] = '\0';
    char copy[512]; /* untokenised copy: "gpu N name TEXT..." keeps the spaces inside TEXT */
    if (strlen(line) >= sizeof copy) {
        return 0;
    }
    memcpy(copy, line, strlen(line) + 1);
    char *tok[FAKE_MAX_TOKENS];
    const char *name = NULL;
    int ntok = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        if (ntok == 3 && strcmp(tok[0], "gpu") == 0 && strcmp(tok[2], "name") == 0) {
            name = copy + (t - line);
            break;
        }
        if (ntok == FAKE_MAX_TOKENS) {
            return 0;
        }
        tok[ntok++] = t;
    }
    if (ntok >= 3 && strcmp(tok[0], "gpu") == 0) {
        unsigned int idx;
        if (!parse_u32(tok[1], &idx) || idx >= FAKE_MAX_GPUS) {
            return 0;
        }
        return parse_gpu_field(&st->gpu[idx], tok, ntok, name);
    }
    if (ntok == 0) {
        return 1;
    }
    if (strcmp(tok[0], "host") == 0 && ntok == 2) {
        snprintf(st->host, sizeof st->host, "%s", tok[1]);
        return strlen(tok[1]) < sizeof st->host;
    }
    if (strcmp(tok[0], "driver") == 0 && ntok == 2) {
        snprintf(st->driver, sizeof st->driver, "%s", tok[1]);
        return strlen(tok[1]) + 3 < sizeof st->driver; /* leaves room for the "12." of the NVML version */
    }
    if (strcmp(tok[0], "count") == 0 && ntok == 2) {
        return parse_u32(tok[1], &st->count) && st->count <= FAKE_MAX_GPUS;
    }
    if (strcmp(tok[0], "init_error") == 0 && ntok == 2) {
        unsigned int rc;
        if (!parse_u32(tok[1], &rc)) {
            return 0;
        }
        st->init_error = (nvmlReturn_t)rc;
        return 1;
    }
    if (strcmp(tok[0], "xid") == 0 && ntok == 3) {
        char type[32];
        snprintf(type, sizeof type, "%llu", (unsigned long long)nvmlEventTypeXidCriticalError);
        return add_event(st, tok[1], type, tok[2]);
    }
    if (strcmp(tok[0], "event") == 0 && ntok == 4) {
        return add_event(st, tok[1], tok[2], tok[3]);
    }
    return 0;
}

/* Reads $FAKE_NVML_STATE into a fresh heap state. No variable means a driver with no GPUs; an unreadable file
 * or a bad line means NVML_ERROR_UNKNOWN, so a misconfigured lab fails loudly. */
static nvmlReturn_t load_state(fake_state **out) {
    fake_state *st = malloc(sizeof *st);
    *out = st;
    if (st == NULL) {
        return NVML_ERROR_MEMORY;
    }
    set_defaults(st);
    const char *path = getenv("FAKE_NVML_STATE");
    if (path == NULL || *path == '\0') {
        return NVML_SUCCESS;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(st->bad_line, sizeof st->bad_line, "cannot open %s", path);
        return NVML_ERROR_UNKNOWN;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0) {
        st->dev = (unsigned long long)sb.st_dev;
        st->ino = (unsigned long long)sb.st_ino;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    nvmlReturn_t rc = NVML_SUCCESS;
    for (unsigned int lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        char original[120];
        snprintf(original, sizeof original, "%s", line);
        original[strcspn(original, "\r\n")] = '\0';
        if (!parse_line(st, line)) {
            snprintf(st->bad_line, sizeof st->bad_line, "%u: %s", lineno, original);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    free(line);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- call prologue / epilogue */

static int is_initialized(void) {
    pthread_mutex_lock(&g_lock);
    int inited = g_refcount > 0;
    pthread_mutex_unlock(&g_lock);
    return inited;
}

/* Starts a call that needs NVML initialised: loads the state. */
static nvmlReturn_t enter(fake_call *c, const char *fn) {
    memset(c, 0, sizeof *c);
    c->fn = fn;
    if (!is_initialized()) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return load_state(&c->st);
}

static nvmlReturn_t injected_failure(const fake_gpu *g, const char *fn) {
    for (int i = 0; i < g->nfails; i++) {
        if (strcmp(g->fails[i].fn, fn) == 0) {
            return g->fails[i].rc;
        }
    }
    return NVML_SUCCESS;
}

/* Starts a per-device call: GPU_IS_LOST for a lost GPU, then any injected failure for this function. */
static nvmlReturn_t enter_index(fake_call *c, const char *fn, unsigned int idx) {
    nvmlReturn_t rc = enter(c, fn);
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    if (idx >= c->st->count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    c->idx = idx;
    c->has_idx = 1;
    c->gpu = &c->st->gpu[idx];
    if (c->gpu->lost) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    return injected_failure(c->gpu, fn);
}

static nvmlReturn_t enter_device(fake_call *c, const char *fn, nvmlDevice_t device) {
    if (device < &g_devices[0] || device >= &g_devices[FAKE_MAX_GPUS]) {
        memset(c, 0, sizeof *c);
        c->fn = fn;
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return enter_index(c, fn, (unsigned int)(device - g_devices));
}

static nvmlReturn_t leave(fake_call *c, nvmlReturn_t rc) {
    trace_call(c, rc);
    free(c->st);
    c->st = NULL;
    return rc;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(src) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* A stable hash of the host name: FNV-1a 64 then MurmurHash3's fmix64, because plain FNV barely changes the
 * high bits for names differing in the last character (n1, n2). deploy/local/fake_nvml.py mirrors it. */
static uint64_t host_hash(const char *host) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)host; *p != '\0'; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* ---------------------------------------------------------------- init, system */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    fake_call c = {.fn = __func__};
    nvmlReturn_t rc = load_state(&c.st);
    if (rc == NVML_SUCCESS && c.st->init_error != NVML_SUCCESS) {
        rc = c.st->init_error;
    }
    if (rc == NVML_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        g_refcount++;
        pthread_mutex_unlock(&g_lock);
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlInit_v2(void) {
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void) {
    fake_call c = {.fn = __func__};
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else {
        g_refcount--;
    }
    pthread_mutex_unlock(&g_lock);
    return leave(&c, rc);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Fake NVML: unlisted error code";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    fake_call c;
    nvmlReturn_t rc = enter(&c, __func__);
    if (rc == NVML_SUCCESS) {
        rc = copy_string(version, length, c.st->driver);
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    fake_call c;
    nvmlReturn_t rc = enter(&c, __func__);
    if (rc == NVML_SUCCESS) {
        char buf[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE + 8];
        snprintf(buf, sizeof buf, "12.%s", c.st->driver);
        rc = copy_string(version, length, buf);
    }
    return leave(&c, rc);
}

/* ---------------------------------------------------------------- enumeration, identity */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    fake_call c;
    nvmlReturn_t rc = enter(&c, __func__);
    if (rc == NVML_SUCCESS) {
        if (deviceCount == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *deviceCount = c.st->count;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    fake_call c;
    nvmlReturn_t rc = enter_index(&c, __func__, index);
    if (rc == NVML_SUCCESS) {
        if (device == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *device = &g_devices[index];
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (index == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *index = c.idx;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        rc = copy_string(name, length, c.gpu->name);
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        uint64_t h = host_hash(c.st->host);
        char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        snprintf(buf, sizeof buf, "GPU-%08x-%04x-%04x-fa4e-%012x", (unsigned int)(h >> 32),
                 (unsigned int)((h >> 16) & 0xFFFFU), (unsigned int)(h & 0xFFFFU), c.idx);
        rc = copy_string(uuid, length, buf);
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS && pci == NULL) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS) {
        /* Domain from the host hash (so nodes differ), bus spaced like an 8-GPU HGX board. */
        unsigned short domain = (unsigned short)((host_hash(c.st->host) >> 24) & 0xFFFFU);
        unsigned char bus = (unsigned char)(0x18U + 0x0DU * c.idx);
        memset(pci, 0, sizeof *pci);
        pci->domain = domain;
        pci->bus = bus;
        pci->device = 0;
        pci->pciDeviceId = 0x233010DEU;    /* H100 SXM5: device 0x2330, vendor 0x10DE */
        pci->pciSubSystemId = 0x16C110DEU;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04hX:%02hhX:00.0", domain, bus);
        snprintf(pci->busId, sizeof pci->busId, "%08X:%02hhX:00.0", (unsigned int)domain, bus);
    }
    return leave(&c, rc);
}

/* ---------------------------------------------------------------- telemetry */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (temp == NULL || sensorType >= NVML_TEMPERATURE_COUNT) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else if (sensorType != NVML_TEMPERATURE_GPU) {
            rc = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *temp = c.gpu->temp;
        }
    }
    return leave(&c, rc);
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (temperature == NULL || temperature->sensorType >= NVML_TEMPERATURE_COUNT) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else if (temperature->version != nvmlTemperature_v1) {
            rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (temperature->sensorType != NVML_TEMPERATURE_GPU) {
            rc = NVML_ERROR_NOT_SUPPORTED;
        } else {
            temperature->temperature = (int)c.gpu->temp;
        }
    }
    return leave(&c, rc);
}
#endif

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (utilization == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            utilization->gpu = c.gpu->util_gpu;
            utilization->memory = c.gpu->util_mem;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (memory == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            memory->total = c.gpu->mem_total;
            memory->used = c.gpu->mem_used;
            memory->free = c.gpu->mem_total > c.gpu->mem_used ? c.gpu->mem_total - c.gpu->mem_used : 0;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (power == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *power = c.gpu->power_mw;
        }
    }
    return leave(&c, rc);
}

/* SM and graphics clocks follow the state; memory and video are fixed H100 values. */
static nvmlReturn_t clock_info(const char *fn, nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                               int max) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, fn, device);
    if (rc == NVML_SUCCESS) {
        if (clock == NULL || (unsigned int)type >= NVML_CLOCK_COUNT) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) {
            *clock = max ? c.gpu->sm_clock_max : c.gpu->sm_clock;
        } else {
            *clock = type == NVML_CLOCK_MEM ? FAKE_MEM_CLOCK_MHZ : FAKE_VIDEO_CLOCK_MHZ;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return clock_info(__func__, device, type, clock, 0);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return clock_info(__func__, device, type, clock, 1);
}

/* ---------------------------------------------------------------- fault counters */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (eccCounts == NULL || errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
            counterType >= NVML_ECC_COUNTER_TYPE_COUNT) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *eccCounts = c.gpu->ecc[errorType][counterType];
        }
    }
    return leave(&c, rc);
}

static nvmlReturn_t clocks_reasons(const char *fn, nvmlDevice_t device, unsigned long long *reasons) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, fn, device);
    if (rc == NVML_SUCCESS) {
        if (reasons == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *reasons = c.gpu->clocks_event;
        }
    }
    return leave(&c, rc);
}

#ifndef FAKE_NVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    return clocks_reasons(__func__, device, clocksEventReasons);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                        unsigned long long *clocksThrottleReasons) {
    return clocks_reasons(__func__, device, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (isPending == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *isPending = c.gpu->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
        }
    }
    return leave(&c, rc);
}

/* Both retired-pages calls: a size query (count 0, no buffer) answers INSUFFICIENT_SIZE with the count, as
 * nvml.h documents; a buffer too small gets the same; addresses are synthetic but distinct per cause. */
static nvmlReturn_t retired_pages(const char *fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                  unsigned int *pageCount, unsigned long long *addresses,
                                  unsigned long long *timestamps) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, fn, device);
    if (rc == NVML_SUCCESS) {
        if (pageCount == NULL || (unsigned int)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            unsigned int n = c.gpu->retired[cause];
            if (*pageCount == 0 && addresses == NULL) {
                rc = n > 0 ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
                *pageCount = n;
            } else if (addresses == NULL) {
                rc = NVML_ERROR_INVALID_ARGUMENT;
            } else if (*pageCount < n) {
                *pageCount = n;
                rc = NVML_ERROR_INSUFFICIENT_SIZE;
            } else {
                for (unsigned int i = 0; i < n; i++) {
                    addresses[i] = 0x100000000ULL * ((unsigned long long)cause + 1) + 0x1000ULL * i;
                    if (timestamps != NULL) {
                        timestamps[i] = 1700000000ULL + i;
                    }
                }
                *pageCount = n;
            }
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    return retired_pages(__func__, device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired_pages(__func__, device, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *corrRows = c.gpu->remap[0];
            *uncRows = c.gpu->remap[1];
            *isPending = c.gpu->remap[2];
            *failureOccurred = c.gpu->remap[3];
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (value == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *value = c.gpu->pcie_replay;
        }
    }
    return leave(&c, rc);
}

/* Field values: the GPU recovery action only (drivers R570+). The call succeeds and each field carries its own
 * return code, as NVML does: a field this "driver" lacks is NOT_SUPPORTED in its nvmlReturn, not in the call's. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS && (values == NULL || valuesCount < 0)) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (rc == NVML_SUCCESS) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        for (int i = 0; i < valuesCount; i++) {
            nvmlFieldValue_t *v = &values[i];
            v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
            v->latencyUsec = 0;
            memset(&v->value, 0, sizeof v->value);
            if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
                v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                v->value.uiVal = c.gpu->recovery_action;
                v->nvmlReturn = (nvmlReturn_t)c.gpu->recovery_action_rc;
            } else {
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            }
        }
    }
    return leave(&c, rc);
}

/* ---------------------------------------------------------------- NVLink */

/* Common checks: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past the last link (how callers find the end). */
static nvmlReturn_t enter_link(fake_call *c, const char *fn, nvmlDevice_t device, unsigned int link) {
    nvmlReturn_t rc = enter_device(c, fn, device);
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    if (c->gpu->nvlinks == 0) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return link < c->gpu->nvlinks ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    fake_call c;
    nvmlReturn_t rc = enter_link(&c, __func__, device, link);
    if (rc == NVML_SUCCESS) {
        if (isActive == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *isActive = NVML_FEATURE_ENABLED;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue) {
    fake_call c;
    nvmlReturn_t rc = enter_link(&c, __func__, device, link);
    if (rc == NVML_SUCCESS) {
        if (counterValue == NULL || (unsigned int)counter >= FAKE_NVLINK_COUNTERS) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *counterValue = c.gpu->nvlink_err[link][counter];
        }
    }
    return leave(&c, rc);
}

/* ---------------------------------------------------------------- events */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (eventTypes == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *eventTypes = c.gpu->events_supported;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    fake_call c;
    nvmlReturn_t rc = enter(&c, __func__);
    if (rc == NVML_SUCCESS) {
        if (set == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *set = calloc(1, sizeof **set); /* next = 0: a new set replays the event log from the start */
            rc = *set != NULL ? NVML_SUCCESS : NVML_ERROR_MEMORY;
        }
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    fake_call c;
    nvmlReturn_t rc = enter_device(&c, __func__, device);
    if (rc == NVML_SUCCESS) {
        if (set == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else if ((eventTypes & ~c.gpu->events_supported) != 0) {
            rc = NVML_ERROR_NOT_SUPPORTED; /* nvml.h: some of the requested event types are not supported */
        } else {
            set->mask[c.idx] |= eventTypes;
        }
    }
    return leave(&c, rc);
}

/* One look at the log: SUCCESS with *data filled, GPU_IS_LOST, or TIMEOUT when there is nothing yet. */
static nvmlReturn_t poll_events(nvmlEventSet_t set, const fake_state *st, nvmlEventData_t *data) {
    /* The lab resets a node by atomically replacing its state file (a new inode): that is a new event log, so
     * start reading it from its first line; a log truncated in place is treated the same way. */
    if (set->positioned && (set->log_dev != st->dev || set->log_ino != st->ino || set->next > st->nevents)) {
        set->next = 0;
    }
    set->positioned = 1;
    set->log_dev = st->dev;
    set->log_ino = st->ino;
    while (set->next < st->nevents) {
        const fake_event *e = &st->events[set->next++];
        if (e->gpu < st->count && (set->mask[e->gpu] & e->type) != 0) {
            data->device = &g_devices[e->gpu];
            data->eventType = e->type & set->mask[e->gpu];
            data->eventData = e->data;
            data->gpuInstanceId = 0xFFFFFFFFU;
            data->computeInstanceId = 0xFFFFFFFFU;
            return NVML_SUCCESS;
        }
    }
    for (unsigned int i = 0; i < st->count; i++) {
        if (set->mask[i] != 0 && st->gpu[i].lost) {
            return NVML_ERROR_GPU_IS_LOST;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    fake_call c = {.fn = __func__};
    if (set == NULL || data == NULL) {
        return leave(&c, NVML_ERROR_INVALID_ARGUMENT);
    }
    long long deadline = now_ns() + (long long)timeoutms * 1000000LL;
    nvmlReturn_t rc;
    for (;;) {
        /* Re-read the state each round (quietly: one trace line per call, not per poll), so an event appended
         * while a thread is blocked here is delivered within one poll interval. */
        rc = enter(&c, __func__);
        if (rc == NVML_SUCCESS) {
            rc = poll_events(set, c.st, data);
        }
        long long left = deadline - now_ns();
        if (rc != NVML_ERROR_TIMEOUT || left <= 0) {
            break;
        }
        free(c.st);
        c.st = NULL;
        struct timespec pause = {0, left < FAKE_POLL_NS ? (long)left : FAKE_POLL_NS};
        nanosleep(&pause, NULL);
    }
    return leave(&c, rc);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    fake_call c;
    nvmlReturn_t rc = enter(&c, __func__);
    if (rc == NVML_SUCCESS) {
        if (set == NULL) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            free(set);
        }
    }
    return leave(&c, rc);
}
