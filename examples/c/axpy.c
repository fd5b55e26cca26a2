/* A C kernel library that allocates through devtensor and launches its own kernel.
 *
 * y = a*x + y on cuda:0: the tensors come from devtensor's caching pool (on the current
 * stream, set with devtensor_set_stream), the kernel is compiled with NVRTC and launched
 * on that stream with the Driver API; devtensor's own device work (a contiguous copy of a
 * reversed view between two launches) is ordered on the same stream; results are copied
 * back to host tensors through devtensor_copy, and every tensor is freed through its
 * DLPack deleter.
 *
 * No CUDA toolkit is needed to build it: the few Driver API and NVRTC prototypes it uses
 * are declared below and resolved with dlopen (libcuda.so.1; NVRTC from $DEVTENSOR_NVRTC,
 * a file or a directory, else libnvrtc.so.13 / .12 on the loader path).
 *
 *   cc -std=c11 -Iinclude -I<dir holding dlpack/dlpack.h> examples/c/axpy.c \
 *      -Ltarget/release -ldevtensor_c -ldl -o axpy && ./axpy
 *
 * Exit status 0 and a last line "axpy: OK" when every check passed.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <devtensor.h>

/* --- the Driver API and NVRTC subset used here (cuda.h / nvrtc.h) -------------------------- */
typedef int CUresult; /* CUDA_SUCCESS == 0 */
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef int nvrtcResult; /* NVRTC_SUCCESS == 0 */
typedef void *nvrtcProgram;
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
enum { CU_STREAM_NON_BLOCKING = 1 };

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamDestroy)(CUstream);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                      const char *const *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
} api;

static int failures = 0;
#define FAIL(...) (fprintf(stderr, "axpy: FAILED: " __VA_ARGS__), fputc('\n', stderr), failures++)
#define CU(call) do { CUresult rc_ = (call); if (rc_ != 0) { FAIL("%s returned CUresult %d", #call, rc_); return 1; } } while (0)
#define NVRTC(call) do { nvrtcResult rc_ = (call); if (rc_ != 0) { FAIL("%s returned nvrtcResult %d", #call, rc_); return 1; } } while (0)
#define DT(call) do { DevtensorStatus st_ = (call); if (st_ != DEVTENSOR_STATUS_OK) { \
    FAIL("%s: %s: %s", #call, devtensor_status_name(st_), devtensor_last_error()); return 1; } } while (0)

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) FAIL("symbol %s not found: %s", name, dlerror());
    return p;
}

/* NVRTC as devtensor finds it: $DEVTENSOR_NVRTC (a library file or a directory), else by name. */
static void *open_nvrtc(void) {
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    const char *env = getenv("DEVTENSOR_NVRTC");
    char path[4096];
    void *lib = env && *env ? dlopen(env, RTLD_NOW) : NULL; /* a library file */
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) {
        if (env && *env) { /* a directory */
            snprintf(path, sizeof path, "%s/%s", env, names[i]);
            lib = dlopen(path, RTLD_NOW);
        }
        if (!lib) lib = dlopen(names[i], RTLD_NOW);
    }
    return lib;
}

static int load_api(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    void *nvrtc = open_nvrtc();
    if (!cuda || !nvrtc) {
        FAIL("cannot load %s", cuda ? "NVRTC (set DEVTENSOR_NVRTC)" : "libcuda.so.1");
        return 1;
    }
#define LOAD(lib, field, name) (*(void **)&api.field = sym(lib, name))
    LOAD(cuda, cuInit, "cuInit");
    LOAD(cuda, cuDeviceGet, "cuDeviceGet");
    LOAD(cuda, cuDeviceGetAttribute, "cuDeviceGetAttribute");
    LOAD(cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(cuda, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    LOAD(cuda, cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(cuda, cuModuleLoadData, "cuModuleLoadData");
    LOAD(cuda, cuModuleGetFunction, "cuModuleGetFunction");
    LOAD(cuda, cuModuleUnload, "cuModuleUnload");
    LOAD(cuda, cuLaunchKernel, "cuLaunchKernel");
    LOAD(cuda, cuStreamCreate, "cuStreamCreate");
    LOAD(cuda, cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(cuda, cuStreamDestroy, "cuStreamDestroy_v2");
    LOAD(nvrtc, nvrtcCreateProgram, "nvrtcCreateProgram");
    LOAD(nvrtc, nvrtcCompileProgram, "nvrtcCompileProgram");
    LOAD(nvrtc, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
    LOAD(nvrtc, nvrtcGetProgramLog, "nvrtcGetProgramLog");
    LOAD(nvrtc, nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
    LOAD(nvrtc, nvrtcGetCUBIN, "nvrtcGetCUBIN");
    LOAD(nvrtc, nvrtcDestroyProgram, "nvrtcDestroyProgram");
#undef LOAD
    return failures != 0;
}

static const char *kSource =
    "extern \"C\" __global__ void axpy(float a, const float *x, float *y, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

/* Compiles kSource for `dev`'s architecture into a cubin (malloc'ed, *cubin). */
static int compile(CUdevice dev, char **cubin) {
    int major = 0, minor = 0;
    CU(api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU(api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    char arch[32];
    snprintf(arch, sizeof arch, "-arch=sm_%d%d", major, minor);
    const char *opts[] = {arch};
    nvrtcProgram prog;
    NVRTC(api.nvrtcCreateProgram(&prog, kSource, "axpy.cu", 0, NULL, NULL));
    if (api.nvrtcCompileProgram(prog, 1, opts) != 0) {
        size_t n = 0;
        api.nvrtcGetProgramLogSize(prog, &n);
        char *log = calloc(n + 1, 1);
        if (log) api.nvrtcGetProgramLog(prog, log);
        FAIL("NVRTC (%s): %s", arch, log ? log : "?");
        free(log);
        return 1;
    }
    size_t size = 0;
    NVRTC(api.nvrtcGetCUBINSize(prog, &size));
    *cubin = malloc(size);
    if (!*cubin) return 1;
    NVRTC(api.nvrtcGetCUBIN(prog, *cubin));
    NVRTC(api.nvrtcDestroyProgram(&prog));
    return 0;
}

static void free_tensor(DLManagedTensorVersioned *t) {
    if (t && t->deleter) t->deleter(t);
}

int main(void) {
    if (load_api()) return 1;
    const DLDevice cuda0 = {kDLCUDA, 0}, cpu = {kDLCPU, 0};
    const DLDataType f32 = {kDLFloat, 32, 1};
    enum { N = 1000 };
    const int64_t shape[1] = {N};
    const float a = 2.0f;
    const uint64_t live_before = devtensor_live_tensors();

    /* The driver, our own context and stream, and the kernel. */
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUmodule module;
    CUfunction axpy;
    char *cubin = NULL;
    CU(api.cuInit(0));
    CU(api.cuDeviceGet(&dev, 0));
    CU(api.cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(api.cuCtxSetCurrent(ctx));
    CU(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (compile(dev, &cubin)) return 1;
    CU(api.cuModuleLoadData(&module, cubin));
    CU(api.cuModuleGetFunction(&axpy, module, "axpy"));

    /* Our stream becomes devtensor's current stream for cuda:0 on this thread. */
    void *previous = (void *)1, *current = NULL;
    DT(devtensor_set_stream(cuda0, stream, &previous));
    DT(devtensor_get_stream(cuda0, &current));
    if (previous != NULL || current != stream) FAIL("current stream %p (was %p), expected %p", current, previous, stream);

    /* Inputs on the host, filled in place. */
    DLManagedTensorVersioned *x_host, *y_host, *out_host, *x, *y;
    DT(devtensor_empty(shape, 1, f32, cpu, NULL, &x_host));
    DT(devtensor_empty(shape, 1, f32, cpu, NULL, &y_host));
    float *xh = x_host->dl_tensor.data, *yh = y_host->dl_tensor.data;
    for (int i = 0; i < N; i++) {
        xh[i] = (float)i;
        yh[i] = 1.0f;
    }

    /* Device tensors from the pool, on the current stream: one through devtensor_empty, one
     * through the DLPackManagedTensorAllocator entry point (it takes the current stream). */
    DT(devtensor_empty(shape, 1, f32, cuda0, current, &x));
    DLPackManagedTensorAllocator alloc = devtensor_managed_tensor_allocator;
    DLTensor prototype = {NULL, cuda0, 1, f32, (int64_t *)shape, NULL, 0};
    if (alloc(&prototype, &y, NULL, NULL) != 0) {
        FAIL("allocator: %s", devtensor_last_error());
        return 1;
    }
    if (y->dl_tensor.device.device_type != kDLCUDA || y->dl_tensor.shape[0] != N || y->version.major != 1)
        FAIL("allocator made the wrong tensor");
    DT(devtensor_copy(&x->dl_tensor, &x_host->dl_tensor, current));
    DT(devtensor_copy(&y->dl_tensor, &y_host->dl_tensor, current));

    /* Our kernel, on the same stream: y = a*x + y (ordered after the copies). */
    void *xp = x->dl_tensor.data, *yp = y->dl_tensor.data;
    int n = N;
    void *params[] = {(void *)&a, &xp, &yp, &n};
    CU(api.cuLaunchKernel(axpy, (N + 255) / 256, 1, 1, 256, 1, 1, 0, current, params, NULL));

    /* A contiguous copy of y reversed (a view with a negative stride): devtensor's copy kernel,
     * queued after our kernel and before the next one, on the device. */
    int64_t rstride = -1;
    DLTensor reversed = y->dl_tensor;
    reversed.data = (float *)y->dl_tensor.data + (N - 1);
    reversed.strides = &rstride;
    DLManagedTensorVersioned *w;
    DT(devtensor_contiguous(&reversed, current, &w));
    const float one = 1.0f;
    void *wp = w->dl_tensor.data;
    void *params2[] = {(void *)&one, &xp, &wp, &n};
    CU(api.cuLaunchKernel(axpy, (N + 255) / 256, 1, 1, 256, 1, 1, 0, current, params2, NULL)); /* w = x + w */

    /* Results back on the host: copies ordered after the kernels, complete on return. */
    DT(devtensor_empty(shape, 1, f32, cpu, NULL, &out_host));
    const float *r = out_host->dl_tensor.data;
    int bad = 0;
    DT(devtensor_copy(&out_host->dl_tensor, &y->dl_tensor, current));
    for (int i = 0; i < N; i++) {
        float want = a * (float)i + 1.0f;
        if (r[i] != want && bad++ < 5) FAIL("y[%d] = %g, expected %g", i, r[i], want);
    }
    DT(devtensor_copy(&out_host->dl_tensor, &w->dl_tensor, current));
    for (int i = 0; i < N; i++) {
        float want = (float)i + (a * (float)(N - 1 - i) + 1.0f);
        if (r[i] != want && bad++ < 5) FAIL("w[%d] = %g, expected %g", i, r[i], want);
    }

    /* A zero-filled device tensor on the stream, read back. */
    DLManagedTensorVersioned *z;
    DT(devtensor_zeros(shape, 1, f32, cuda0, current, &z));
    DT(devtensor_copy(&out_host->dl_tensor, &z->dl_tensor, current));
    for (int i = 0; i < N; i++) {
        if (r[i] != 0.0f && bad++ < 5) FAIL("zeros[%d] = %g", i, r[i]);
    }

    /* Every tensor freed through its deleter, once; the pool holds no block any more. */
    DevtensorMemoryStats stats;
    DT(devtensor_memory_stats(cuda0, &stats));
    if (stats.active_blocks != 4) FAIL("%llu active device blocks, expected 4", (unsigned long long)stats.active_blocks);
    DLManagedTensorVersioned *all[] = {x_host, y_host, out_host, x, y, w, z};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free_tensor(all[i]);
    if (devtensor_live_tensors() != live_before)
        FAIL("%llu tensors still live", (unsigned long long)(devtensor_live_tensors() - live_before));
    DT(devtensor_memory_stats(cuda0, &stats));
    if (stats.active_blocks != 0 || stats.allocated != 0)
        FAIL("after the deleters: %llu blocks, %llu bytes still allocated", (unsigned long long)stats.active_blocks,
             (unsigned long long)stats.allocated);
    uint64_t released = 0;
    CU(api.cuStreamSynchronize(stream));
    DT(devtensor_empty_cache(cuda0, &released));
    DT(devtensor_memory_stats(cuda0, &stats));
    if (released == 0 || stats.reserved != 0)
        FAIL("empty_cache released %llu bytes, %llu still reserved", (unsigned long long)released,
             (unsigned long long)stats.reserved);

    /* Back to the default stream, then tear down what we made. */
    DT(devtensor_set_stream(cuda0, NULL, &previous));
    if (previous != stream) FAIL("set_stream returned %p as the previous stream, expected %p", previous, stream);
    CU(api.cuStreamDestroy(stream));
    CU(api.cuModuleUnload(module));
    CU(api.cuDevicePrimaryCtxRelease(dev));
    free(cubin);
    if (failures) return 1;
    printf("axpy: y = %g*x + y over %d floats on cuda:0, on our own stream: OK\n", a, N);
    return 0;
}
