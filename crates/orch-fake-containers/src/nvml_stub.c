/*
 * nvml_stub.c: a stand-in for NVIDIA's `libnvidia-ml.so.1` (NVML) on machines without a GPU.
 *
 * Built by orch-testkit (`orch_testkit::gpu::nvml_stub()`) with
 *   cc -shared -fPIC -O2 -fvisibility=hidden -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1
 * linked against libc only and checked to need no glibc symbol version above GLIBC_2.17, so the
 * same file loads in old (Debian bullseye, glibc 2.31, and older) and new (trixie, glibc 2.41)
 * container images. It never prints anything and never aborts: a NULL pointer or an unknown
 * handle is NVML_ERROR_INVALID_ARGUMENT, as in the real library.
 *
 * What it models: one host with a pool of 8 GPUs
 *   name     "NVIDIA H100 80GB HBM3"
 *   memory   85520809984 bytes total (81559 MiB): 512 MiB reserved, 70000 MiB used
 *   uuid     GPU-5a6b7c8d-0000-4000-8000-00000000000N   (N = 0..7, the pool index)
 *   pci      00000000:1N:00.0 (domain 0, bus 0x1N, device 0), device id 0x233010DE
 *   cuda compute capability 9.0, enforced power limit 700000 mW, 45 C,
 *   clocks: graphics/SM 1980 MHz, memory 2619 MHz, video 1755 MHz,
 *   utilization 87 % (gpu) / 41 % (memory),
 *   power: 300 W +- 30 W, a triangle wave with a 10 s period (each GPU a different phase),
 *   total energy (mJ): a per-GPU base + the exact integral of that power over CLOCK_MONOTONIC
 *     (time since boot, so the counter agrees between processes and containers, and grows
 *     strictly with wall time, as the real one counts since the driver loaded),
 *   driver 580.95.05, NVML 13.580.95.05, CUDA driver API 13000 (13.0).
 *
 * Which GPUs a process sees is decided at nvmlInit* from the environment, the way the NVIDIA
 * container toolkit decides which GPUs a container gets:
 *   NVIDIA_VISIBLE_DEVICES unset or "all"  -> the first ORCH_NVML_STUB_GPUS GPUs of the pool
 *                                             (default 2, at most 8)
 *   NVIDIA_VISIBLE_DEVICES "", "none", "void" -> no GPU (init still succeeds, count 0)
 *   otherwise a comma list of pool indices ("0,3") and/or UUIDs ("GPU-5a6b...0003", or a prefix
 *   of one that names exactly one GPU) -> those, in that order; unknown, ambiguous or repeated
 *   entries are skipped (the real toolkit refuses to start such a container).
 * Device index i (nvmlDeviceGetHandleByIndex) is the i-th visible GPU, as in a container.
 *
 *   ORCH_NVML_STUB_FAIL=init -> every nvmlInit* returns NVML_ERROR_DRIVER_NOT_LOADED (9), the
 *                              error of a container started without the driver.
 *
 * Exports the calls nvml-wrapper 0.12 makes for what orch-agent reads (signatures as in nvml.h).
 * Calls before nvmlInit* (or after the last nvmlShutdown) return NVML_ERROR_UNINITIALIZED.
 */

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define POOL 8
#define DEFAULT_VISIBLE 2
#define MEM_TOTAL 85520809984ULL
#define MEM_RESERVED (512ULL << 20)
#define MEM_USED (70000ULL << 20)

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

struct gpu {
    unsigned int pool_index;
    char uuid[48];
    char bus_id[32];
};

/* Handles (nvmlDevice_t) are pointers into this array. */
static struct gpu pool[POOL];
static int visible[POOL];
static unsigned int visible_count;
static int init_count;

static const char NAME[] = "NVIDIA H100 80GB HBM3";
static const char DRIVER[] = "580.95.05";
static const char NVML_VERSION[] = "13.580.95.05";
static const char UUID_PREFIX[] = "GPU-5a6b7c8d-0000-4000-8000-00000000000";

/* ---- small helpers (no stdio: nothing to print, no symbol versions to pin) ---- */

static int eq(const char *a, const char *b) { return strcmp(a, b) == 0; }


static nvmlReturn_t copy_str(const char *src, char *dst, unsigned int len) {
    size_t n = strlen(src);
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((size_t)len < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* The pool does not depend on the environment: filled when the library loads. */
__attribute__((constructor)) static void fill_pool(void) {
    for (unsigned int i = 0; i < POOL; i++) {
        struct gpu *g = &pool[i];
        g->pool_index = i;
        memcpy(g->uuid, UUID_PREFIX, sizeof(UUID_PREFIX) - 1);
        g->uuid[sizeof(UUID_PREFIX) - 1] = (char)('0' + i);
        g->uuid[sizeof(UUID_PREFIX)] = '\0';
        /* "00000000:1N:00.0" */
        memcpy(g->bus_id, "00000000:10:00.0", sizeof("00000000:10:00.0"));
        g->bus_id[10] = (char)('0' + i);
    }
}

static int already_visible(int idx) {
    for (unsigned int i = 0; i < visible_count; i++)
        if (visible[i] == idx) return 1;
    return 0;
}

/* One NVIDIA_VISIBLE_DEVICES entry (trimmed, len > 0) -> pool index or -1. */
static int lookup(const char *s, size_t n) {
    int digits = 1;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') digits = 0;
    if (digits) {
        unsigned long v = 0;
        for (size_t i = 0; i < n && v < 1000; i++) v = v * 10 + (unsigned long)(s[i] - '0');
        return v < POOL ? (int)v : -1;
    }
    int found = -1;
    for (int i = 0; i < POOL; i++) {
        if (n <= strlen(pool[i].uuid) && memcmp(pool[i].uuid, s, n) == 0) {
            if (found >= 0) return -1; /* ambiguous prefix */
            found = i;
        }
    }
    return found;
}

static unsigned int default_count(void) {
    const char *s = getenv("ORCH_NVML_STUB_GPUS");
    if (s == NULL || *s == '\0') return DEFAULT_VISIBLE;
    unsigned long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return DEFAULT_VISIBLE;
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > POOL) return POOL;
    }
    return (unsigned int)v;
}

static void choose_visible(void) {
    visible_count = 0;
    const char *s = getenv("NVIDIA_VISIBLE_DEVICES");
    if (s == NULL || eq(s, "all")) {
        unsigned int n = default_count();
        for (unsigned int i = 0; i < n; i++) visible[visible_count++] = (int)i;
        return;
    }
    if (*s == '\0' || eq(s, "none") || eq(s, "void")) return;
    const char *p = s;
    while (*p && visible_count < POOL) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *a = p;
        const char *b = p + len;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > a) {
            int idx = lookup(a, (size_t)(b - a));
            if (idx >= 0 && !already_visible(idx)) visible[visible_count++] = idx;
        }
        if (end == NULL) break;
        p = end + 1;
    }
}

static const struct gpu *gpu_of(const void *dev) {
    const struct gpu *g = (const struct gpu *)dev;
    if (g < &pool[0] || g >= &pool[POOL]) return NULL;
    if ((size_t)((const char *)g - (const char *)&pool[0]) % sizeof(struct gpu) != 0) return NULL;
    return g;
}

#define DEVICE_OR_RETURN(dev, g)                                  \
    const struct gpu *g = gpu_of(dev);                            \
    if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) <= 0)      \
        return NVML_ERROR_UNINITIALIZED;                          \
    if (g == NULL) return NVML_ERROR_INVALID_ARGUMENT

/* Seconds since boot (CLOCK_MONOTONIC). */
static double now_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define POWER_MEAN_W 300.0
#define POWER_SWING_W 30.0
#define POWER_PERIOD_S 10.0

static double frac(double x) { return x - (double)(long long)x; }

/* Triangle wave in [-1, 1] over a period of 1: -1 at 0, +1 at 0.5. */
static double tri(double x) {
    double f = frac(x);
    return f < 0.5 ? 4.0 * f - 1.0 : 3.0 - 4.0 * f;
}

/* Integral of tri from 0 to frac(x); a whole period integrates to 0. */
static double tri_integral(double x) {
    double f = frac(x);
    return f < 0.5 ? 2.0 * f * f - f : -2.0 * f * f + 3.0 * f - 1.0;
}

static double phase(const struct gpu *g) { return (double)g->pool_index / POOL; }

static unsigned int power_mw(const struct gpu *g, double t) {
    double w = POWER_MEAN_W + POWER_SWING_W * tri(t / POWER_PERIOD_S + phase(g));
    return (unsigned int)(w * 1000.0);
}

static unsigned long long energy_mj(const struct gpu *g, double t) {
    double base = 123456789000.0 + 1e9 * (double)g->pool_index;
    double x = t / POWER_PERIOD_S + phase(g);
    double joules = POWER_MEAN_W * t +
                    POWER_SWING_W * POWER_PERIOD_S * (tri_integral(x) - tri_integral(phase(g)));
    return (unsigned long long)(base + joules * 1000.0);
}

/* ---- init / shutdown / errors ---- */

static nvmlReturn_t do_init(void) {
    const char *fail = getenv("ORCH_NVML_STUB_FAIL");
    if (fail != NULL && eq(fail, "init")) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (__atomic_fetch_add(&init_count, 1, __ATOMIC_ACQ_REL) == 0) choose_visible();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void) {
    int n = __atomic_load_n(&init_count, __ATOMIC_ACQUIRE);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&init_count, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return NVML_SUCCESS;
    }
    return NVML_ERROR_UNINITIALIZED;
}

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system ---- */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_str(DRIVER, version, length);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_str(NVML_VERSION, version, length);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (v == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *v = 13000;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- devices ---- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) <= 0) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = visible_count;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) <= 0) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= visible_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &pool[visible[index]];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) <= 0) return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < visible_count; i++) {
        if (eq(pool[visible[i]].uuid, uuid)) {
            *device = &pool[visible[i]];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index) {
    DEVICE_OR_RETURN(device, g);
    if (index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < visible_count; i++) {
        if (visible[i] == (int)g->pool_index) {
            *index = i;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(void *device, unsigned int *minor) {
    DEVICE_OR_RETURN(device, g);
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->pool_index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    return copy_str(NAME, name, length);
}

API nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    DEVICE_OR_RETURN(device, g);
    return copy_str(g->uuid, uuid, length);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* v1 counts the reserved memory as used. */
    memory->total = MEM_TOTAL;
    memory->used = MEM_USED + MEM_RESERVED;
    memory->free = MEM_TOTAL - memory->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = MEM_TOTAL;
    memory->reserved = MEM_RESERVED;
    memory->used = MEM_USED;
    memory->free = MEM_TOTAL - MEM_RESERVED - MEM_USED;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    DEVICE_OR_RETURN(device, g);
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    memcpy(pci->busId, g->bus_id, strlen(g->bus_id) + 1);
    /* busIdLegacy: "0000:1N:00.0" (4-digit domain) */
    memcpy(pci->busIdLegacy, g->bus_id + 4, strlen(g->bus_id + 4) + 1);
    pci->domain = 0;
    pci->bus = 0x10 + g->pool_index;
    pci->device = 0;
    pci->pciDeviceId = 0x233010DE;
    pci->pciSubSystemId = 0x16C110DE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(void *device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (major == NULL || minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *device, unsigned int *limit) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (limit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = 700000;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(void *device, unsigned int *limit) {
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *power) {
    DEVICE_OR_RETURN(device, g);
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *power = power_mw(g, now_s());
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *device, unsigned long long *energy) {
    DEVICE_OR_RETURN(device, g);
    if (energy == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *energy = energy_mj(g, now_s());
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (util == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = 87;
    util->memory = 41;
    return NVML_SUCCESS;
}

/* nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video. */
static nvmlReturn_t clock_mhz(unsigned int type, unsigned int *clock) {
    if (clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case 0: *clock = 1980; return NVML_SUCCESS;
    case 1: *clock = 1980; return NVML_SUCCESS;
    case 2: *clock = 2619; return NVML_SUCCESS;
    case 3: *clock = 1755; return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

API nvmlReturn_t nvmlDeviceGetClockInfo(void *device, unsigned int type, unsigned int *clock) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    return clock_mhz(type, clock);
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(void *device, unsigned int type, unsigned int *clock) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    return clock_mhz(type, clock);
}

/* nvmlTemperatureSensors_t: 0 is NVML_TEMPERATURE_GPU, the only one. */
API nvmlReturn_t nvmlDeviceGetTemperature(void *device, unsigned int sensor, unsigned int *temp) {
    DEVICE_OR_RETURN(device, g);
    (void)g;
    if (temp == NULL || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 45;
    return NVML_SUCCESS;
}
