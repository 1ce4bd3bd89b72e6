/*
 * A stand-in for libnvidia-ml.so.1, for tests on machines without an NVIDIA driver.
 *
 * It implements exactly the NVML entry points that gpu_pipeline.lib.nvml_sampler reaches through the
 * real pynvml (nvidia-ml-py), with the C signatures of nvml.h, and returns deterministic values that
 * the tests recompute. Build: gcc -shared -fPIC -O1 -o DIR/libnvidia-ml.so.1 fake_nvml.c, then put DIR
 * on LD_LIBRARY_PATH of a fresh process (pynvml loads the library once per process with
 * CDLL("libnvidia-ml.so.1")).
 *
 * Configuration (environment, read at nvmlInitWithFlags):
 *   FAKE_NVML_GPUS=N           number of GPUs (default 1, at most 16)
 *   FAKE_NVML_MIG=i,j          indices of GPUs in MIG mode; each has MIG devices in slots 0 and 2 of
 *                              7 (slot 1 is empty: NVML_ERROR_NOT_FOUND, as on a real partly
 *                              partitioned GPU)
 *   FAKE_NVML_NOT_SUPPORTED=a,b  fields answering NVML_ERROR_NOT_SUPPORTED on every device:
 *                              util, memory, power, power_limit, temperature, clock, energy, mig_mode
 *   FAKE_NVML_MISSING=a,b      versioned entry points answering NVML_ERROR_FUNCTION_NOT_FOUND (what
 *                              pynvml raises when an older driver lacks the symbol): memory_v2,
 *                              temperature_v
 *   FAKE_NVML_FAIL_AFTER=N     the driver "vanishes" after N sampling ticks ...
 *   FAKE_NVML_FAIL_COUNT=M     ... for M ticks (default: forever), then comes back
 *   FAKE_NVML_FAIL_CODE=C      the code every call returns meanwhile (default 9, DRIVER_NOT_LOADED)
 *   FAKE_NVML_INIT_FAIL=C      nvmlInitWithFlags always returns C (e.g. 9: no kernel driver)
 *   FAKE_NVML_LOST=i,j         indices of GPUs that are "lost": every call taking the GPU's handle or
 *                              one of its MIG devices' handles answers FAKE_NVML_LOST_CODE, except
 *                              nvmlDeviceGetUUID (the driver keeps the UUID of a GPU off the bus)
 *   FAKE_NVML_LOST_CODE=C      that code (default 15, GPU_IS_LOST; 16 is RESET_REQUIRED)
 *
 * A "tick" is one sampling attempt: one call of nvmlDeviceGetCount_v2, or one nvmlInitWithFlags
 * that fails because the tick it starts lies in the failure window. A sampler that calls GetCount
 * once per sample, and re-initializes before the next sample after an error, therefore fails
 * exactly on attempts N+1 .. N+M (1-based).
 *
 * Values of GPU i (k = how many times that value was read from that device before):
 *   UUID GPU-%08x-1111-2222-3333-%012x with 0x5ca1ab00+i and i; name "NVIDIA Fake A100-SXM4-80GB"
 *   utilization gpu 40+i %, memory 20+i %
 *   memory v2: total 81920 MiB, reserved 512 MiB, used 1024*(i+1) MiB + 512 KiB, free = the rest
 *   memory v1: total 81920 MiB, used = v2 used + reserved, free = the rest
 *   power 100000 + 1000*i + 500*k mW; enforced power limit 400000 + 1000*i mW
 *   temperature 30+i C; SM clock 1410+i MHz; energy 1000000*(i+1) + 12345*k mJ
 * MIG device in slot s of GPU i: UUID MIG-%08x-aaaa-bbbb-cccc-%012x with 0x0e1e0000+16*i+s and
 * 16*i+s, name "NVIDIA Fake A100-SXM4-80GB MIG 3g.40gb" (slot 0, GPU instance 2, 40192 MiB) or
 * "... MIG 1g.10gb" (slot 2, GPU instance 9, 9728 MiB), used 100*(s+1) MiB; utilization, power,
 * power limit, temperature, clock and energy are NOT_SUPPORTED on MIG handles, and utilization is
 * NOT_SUPPORTED on a GPU in MIG mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#define MAX_GPUS 16
#define MIG_SLOTS 7
#define MiB 1048576ULL

typedef struct fake_device {
    int index;      /* GPU index (of the parent for a MIG device) */
    int mig_slot;   /* -1: a physical GPU */
    unsigned long long power_reads;
    unsigned long long energy_reads;
} fake_device;
typedef fake_device *nvmlDevice_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int version; unsigned int sensorType; int temperature; } nvmlTemperature_v1_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
#define nvmlTemperature_v1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1 << 24)))

static fake_device gpus[MAX_GPUS];
static fake_device migs[MAX_GPUS][MIG_SLOTS];
static int refcount = 0;
static int n_gpus = 1;
static int mig_on[MAX_GPUS];
static char not_supported[256];
static char missing[256];
static long fail_after = -1, fail_count = -1;
static int fail_code = NVML_ERROR_DRIVER_NOT_LOADED;
static int lost[MAX_GPUS];
static int lost_code = NVML_ERROR_GPU_IS_LOST;
static long ticks = 0;

static const char *NAME = "NVIDIA Fake A100-SXM4-80GB";

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return (v && *v) ? strtol(v, NULL, 10) : dflt;
}

static void env_copy(const char *name, char *dst, size_t n) {
    const char *v = getenv(name);
    snprintf(dst, n, ",%s,", v ? v : "");
}

static int listed(const char *list, const char *word) {
    char key[64];
    snprintf(key, sizeof key, ",%s,", word);
    return strstr(list, key) != NULL;
}

static void index_list(const char *name, int *flags) {
    memset(flags, 0, MAX_GPUS * sizeof *flags);
    const char *m = getenv(name);
    if (m) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", m);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            int i = atoi(tok);
            if (i >= 0 && i < MAX_GPUS) flags[i] = 1;
        }
    }
}

static void configure(void) {
    n_gpus = (int)env_long("FAKE_NVML_GPUS", 1);
    if (n_gpus < 0) n_gpus = 0;
    if (n_gpus > MAX_GPUS) n_gpus = MAX_GPUS;
    index_list("FAKE_NVML_MIG", mig_on);
    index_list("FAKE_NVML_LOST", lost);
    lost_code = (int)env_long("FAKE_NVML_LOST_CODE", NVML_ERROR_GPU_IS_LOST);
    env_copy("FAKE_NVML_NOT_SUPPORTED", not_supported, sizeof not_supported);
    env_copy("FAKE_NVML_MISSING", missing, sizeof missing);
    fail_after = env_long("FAKE_NVML_FAIL_AFTER", -1);
    fail_count = env_long("FAKE_NVML_FAIL_COUNT", -1);
    fail_code = (int)env_long("FAKE_NVML_FAIL_CODE", NVML_ERROR_DRIVER_NOT_LOADED);
}

static int failing_at(long tick) {
    if (fail_after < 0 || tick <= fail_after) return 0;
    return fail_count < 0 || tick <= fail_after + fail_count;
}

/* Common checks of every device call: the driver is there, the library is initialized. */
static nvmlReturn_t gate(void) {
    if (failing_at(ticks)) return fail_code;
    if (refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) {
    if (d >= &gpus[0] && d < &gpus[n_gpus]) return 1;
    if (d >= &migs[0][0] && d < &migs[MAX_GPUS][0]) {
        return d->index < n_gpus && mig_on[d->index] && (d->mig_slot == 0 || d->mig_slot == 2);
    }
    return 0;
}

#define DEVICE_CALL_ANY(dev, out)                          \
    do {                                                   \
        nvmlReturn_t r_ = gate();                          \
        if (r_ != NVML_SUCCESS) return r_;                 \
        if (!valid(dev) || (out) == NULL) return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

/* Every device call but GetUUID: a lost GPU (and its MIG devices) answers lost_code. */
#define DEVICE_CALL(dev, out)                              \
    do {                                                   \
        DEVICE_CALL_ANY(dev, out);                         \
        if (lost[(dev)->index]) return lost_code;          \
    } while (0)

#define UNSUPPORTED(field) \
    do { if (listed(not_supported, field)) return NVML_ERROR_NOT_SUPPORTED; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    long init_fail = env_long("FAKE_NVML_INIT_FAIL", 0);
    if (init_fail) return (nvmlReturn_t)init_fail;
    if (refcount == 0) configure();
    if (failing_at(ticks + 1)) {
        ticks++;
        return fail_code;
    }
    for (int i = 0; i < MAX_GPUS; i++) {
        gpus[i].index = i;
        gpus[i].mig_slot = -1;
        for (int s = 0; s < MIG_SLOTS; s++) {
            migs[i][s].index = i;
            migs[i][s].mig_slot = s;
        }
    }
    refcount++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    if (refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    refcount--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ticks++;
    nvmlReturn_t r = gate();
    if (r != NVML_SUCCESS) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t r = gate();
    if (r != NVML_SUCCESS) return r;
    if (!device || index >= (unsigned int)n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int length) {
    if (strlen(s) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

static const char *mig_profile(int slot) { return slot == 0 ? "3g.40gb" : "1g.10gb"; }

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device, name);
    char buf[128];
    if (device->mig_slot >= 0)
        snprintf(buf, sizeof buf, "%s MIG %s", NAME, mig_profile(device->mig_slot));
    else
        snprintf(buf, sizeof buf, "%s", NAME);
    return copy_string(buf, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL_ANY(device, uuid);
    char buf[96];
    if (device->mig_slot >= 0) {
        unsigned int k = 16u * (unsigned int)device->index + (unsigned int)device->mig_slot;
        snprintf(buf, sizeof buf, "MIG-%08x-aaaa-bbbb-cccc-%012x", 0x0e1e0000u + k, k);
    } else {
        snprintf(buf, sizeof buf, "GPU-%08x-1111-2222-3333-%012x", 0x5ca1ab00u + (unsigned int)device->index,
                 (unsigned int)device->index);
    }
    return copy_string(buf, uuid, length);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEVICE_CALL(device, utilization);
    UNSUPPORTED("util");
    if (device->mig_slot >= 0 || mig_on[device->index]) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = 40u + (unsigned int)device->index;
    utilization->memory = 20u + (unsigned int)device->index;
    return NVML_SUCCESS;
}

static void memory_of(nvmlDevice_t d, unsigned long long *total, unsigned long long *reserved,
                      unsigned long long *used) {
    if (d->mig_slot >= 0) {
        *total = (d->mig_slot == 0 ? 40192ULL : 9728ULL) * MiB;
        *reserved = 0;
        *used = 100ULL * (unsigned long long)(d->mig_slot + 1) * MiB;
    } else {
        *total = 81920ULL * MiB;
        *reserved = 512ULL * MiB;
        *used = 1024ULL * (unsigned long long)(d->index + 1) * MiB + 512ULL * 1024ULL;
    }
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE_CALL(device, memory);
    if (listed(missing, "memory_v2")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    UNSUPPORTED("memory");
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, reserved, used;
    memory_of(device, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - reserved - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE_CALL(device, memory);
    UNSUPPORTED("memory");
    unsigned long long total, reserved, used;
    memory_of(device, &total, &reserved, &used);
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - reserved - used;
    return NVML_SUCCESS;
}

static int mig_handle(nvmlDevice_t d) { return d->mig_slot >= 0; }

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_CALL(device, power);
    UNSUPPORTED("power");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *power = 100000u + 1000u * (unsigned int)device->index + 500u * (unsigned int)device->power_reads++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEVICE_CALL(device, limit);
    UNSUPPORTED("power_limit");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *limit = 400000u + 1000u * (unsigned int)device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp) {
    DEVICE_CALL(device, temp);
    UNSUPPORTED("temperature");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 30u + (unsigned int)device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature) {
    DEVICE_CALL(device, temperature);
    if (listed(missing, "temperature_v")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    UNSUPPORTED("temperature");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = 30 + device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock) {
    DEVICE_CALL(device, clock);
    UNSUPPORTED("clock");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (type != 1) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_CLOCK_SM */
    *clock = 1410u + (unsigned int)device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    DEVICE_CALL(device, energy);
    UNSUPPORTED("energy");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *energy = 1000000ULL * (unsigned long long)(device->index + 1) + 12345ULL * device->energy_reads++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_CALL(device, currentMode);
    if (!pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    UNSUPPORTED("mig_mode");
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = (unsigned int)mig_on[device->index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_CALL(device, count);
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *count = mig_on[device->index] ? MIG_SLOTS : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    DEVICE_CALL(device, migDevice);
    if (mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    if (!mig_on[device->index] || index >= MIG_SLOTS) return NVML_ERROR_INVALID_ARGUMENT;
    if (index != 0 && index != 2) return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[device->index][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_CALL(device, id);
    if (!mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    *id = device->mig_slot == 0 ? 2u : 9u;
    return NVML_SUCCESS;
}
