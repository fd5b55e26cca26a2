/* devtensor's C ABI on the host: kDLCPU tensors, copies between them and foreign tensors,
 * the DLPackManagedTensorAllocator entry point, status codes and last-error text, and
 * deleters that run exactly once. Runs on any machine (no GPU needed).
 *
 *   cc -std=c11 -Iinclude -I<dir holding dlpack/dlpack.h> examples/c/cpu_tensors.c \
 *      -Ltarget/release -ldevtensor_c -o cpu_tensors && ./cpu_tensors
 *
 * Exit status 0 and a last line "cpu_tensors: OK" when every check passed.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <devtensor.h>

static int failures = 0;
#define CHECK(cond, ...) \
    do { if (!(cond)) { fprintf(stderr, "cpu_tensors:%d: FAILED: ", __LINE__); \
         fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures++; } } while (0)
#define OK(call) do { DevtensorStatus st_ = (call); CHECK(st_ == DEVTENSOR_STATUS_OK, "%s: %s: %s", #call, \
    devtensor_status_name(st_), devtensor_last_error()); if (st_ != DEVTENSOR_STATUS_OK) return 1; } while (0)
/* `call` fails with `status` and a last error containing `text`. */
#define FAILS(call, status, text) do { DevtensorStatus st_ = (call); \
    CHECK(st_ == (status), "%s returned %s, expected %s", #call, devtensor_status_name(st_), \
          devtensor_status_name(status)); \
    CHECK(strstr(devtensor_last_error(), (text)) != NULL, "%s: last error \"%s\" lacks \"%s\"", #call, \
          devtensor_last_error(), (text)); } while (0)

static const DLDevice cpu = {kDLCPU, 0};
static const DLDataType f32 = {kDLFloat, 32, 1};

/* A foreign producer's managed tensor: a deleter that counts its calls. */
static int foreign_deletes = 0;
static void foreign_deleter(DLManagedTensorVersioned *self) {
    (void)self;
    foreign_deletes++;
}

/* SetError for the allocator: records each call. */
struct errors {
    int calls;
    char kind[64];
    char message[512];
};
static void set_error(void *ctx, const char *kind, const char *message) {
    struct errors *e = ctx;
    e->calls++;
    snprintf(e->kind, sizeof e->kind, "%s", kind);
    snprintf(e->message, sizeof e->message, "%s", message);
}

static void free_tensor(DLManagedTensorVersioned *t) {
    if (t && t->deleter) t->deleter(t);
}

int main(void) {
    const uint64_t live_before = devtensor_live_tensors();
    DevtensorMemoryStats before, after;
    OK(devtensor_memory_stats(cpu, &before));

    /* zeros: a 3x4 float32 tensor, every byte zero, C-contiguous. */
    const int64_t shape[2] = {3, 4};
    DLManagedTensorVersioned *a = NULL;
    OK(devtensor_zeros(shape, 2, f32, cpu, NULL, &a));
    CHECK(a->version.major == 1 && a->flags == 0, "version %u.%u flags %llu", a->version.major, a->version.minor,
          (unsigned long long)a->flags);
    CHECK(a->dl_tensor.ndim == 2 && a->dl_tensor.shape[0] == 3 && a->dl_tensor.shape[1] == 4, "shape");
    CHECK(a->dl_tensor.strides[0] == 4 && a->dl_tensor.strides[1] == 1, "strides");
    CHECK(a->dl_tensor.device.device_type == kDLCPU, "device");
    float *av = a->dl_tensor.data;
    for (int i = 0; i < 12; i++) CHECK(av[i] == 0.0f, "zeros[%d] = %g", i, av[i]);

    /* A foreign 4x3 array seen transposed (shape 3x4, strides 1,3): copied into `a`. */
    float foreign[12];
    for (int i = 0; i < 12; i++) foreign[i] = (float)i;
    int64_t tshape[2] = {3, 4}, tstrides[2] = {1, 3};
    DLTensor transposed = {foreign, cpu, 2, f32, tshape, tstrides, 0};
    OK(devtensor_copy(&a->dl_tensor, &transposed, NULL));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) CHECK(av[i * 4 + j] == foreign[j * 3 + i], "copy [%d][%d] = %g", i, j, av[i * 4 + j]);

    /* contiguous of the same view: a new tensor of ours with the same values. */
    DLManagedTensorVersioned *c = NULL;
    OK(devtensor_contiguous(&transposed, NULL, &c));
    CHECK(memcmp(c->dl_tensor.data, av, sizeof foreign) == 0, "contiguous values");
    CHECK(c->dl_tensor.strides[0] == 4 && c->dl_tensor.strides[1] == 1, "contiguous strides");

    /* A foreign managed tensor, borrowed by devtensor_copy_managed: its deleter is ours to call. */
    float fdata[12] = {0};
    int64_t fshape[2] = {3, 4};
    DLManagedTensorVersioned fm = {{1, 3}, NULL, foreign_deleter, 0, {fdata, cpu, 2, f32, fshape, NULL, 0}};
    OK(devtensor_copy_managed(&fm, c, NULL));
    CHECK(memcmp(fdata, av, sizeof fdata) == 0, "copy_managed values");
    CHECK(foreign_deletes == 0, "devtensor called a borrowed tensor's deleter %d times", foreign_deletes);
    fm.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    FAILS(devtensor_copy_managed(&fm, c, NULL), DEVTENSOR_STATUS_READ_ONLY, "read-only");
    fm.flags = 0;
    fm.version.major = 2;
    FAILS(devtensor_copy_managed(&fm, c, NULL), DEVTENSOR_STATUS_INVALID_TENSOR, "major version 2");
    fm.version.major = 1;
    foreign_deleter(&fm); /* the producer's own release, once */
    CHECK(foreign_deletes == 1, "foreign deleter ran %d times", foreign_deletes);

    /* The allocator entry point, called through the dlpack.h function-pointer type. */
    DLPackManagedTensorAllocator alloc = devtensor_managed_tensor_allocator;
    int64_t pshape[3] = {2, 3, 5};
    DLTensor proto = {NULL, cpu, 3, {kDLInt, 64, 1}, pshape, NULL, 0};
    DLManagedTensorVersioned *e = NULL;
    struct errors errs = {0};
    CHECK(alloc(&proto, &e, &errs, set_error) == 0, "allocator: %s", devtensor_last_error());
    CHECK(errs.calls == 0, "SetError called on success");
    CHECK(e && e->dl_tensor.ndim == 3 && e->dl_tensor.shape[2] == 5 && e->dl_tensor.dtype.code == kDLInt &&
              e->dl_tensor.dtype.bits == 64, "allocator's tensor");
    proto.dtype.bits = 7; /* no such integer width */
    DLManagedTensorVersioned *untouched = (DLManagedTensorVersioned *)&errs;
    CHECK(alloc(&proto, &untouched, &errs, set_error) == -1, "allocator accepted int7");
    CHECK(errs.calls == 1, "SetError called %d times, expected once", errs.calls);
    CHECK(strcmp(errs.kind, "ValueError") == 0, "SetError kind %s", errs.kind);
    CHECK(strstr(errs.message, "unsupported DLPack dtype") != NULL, "SetError message %s", errs.message);
    CHECK(strcmp(errs.message, devtensor_last_error()) == 0, "SetError and last error differ");
    CHECK(untouched == (DLManagedTensorVersioned *)&errs, "*out written on failure");
    CHECK(alloc(NULL, &untouched, &errs, set_error) == -1 && errs.calls == 2, "NULL prototype");
    CHECK(strcmp(errs.kind, "TypeError") == 0, "NULL prototype: kind %s", errs.kind);
    CHECK(alloc(&proto, &untouched, NULL, NULL) == -1, "failure without SetError");

    /* Status codes and last-error text. */
    DLManagedTensorVersioned *t = NULL;
    FAILS(devtensor_empty(shape, 2, f32, cpu, NULL, NULL), DEVTENSOR_STATUS_NULL_POINTER, "`out` is NULL");
    FAILS(devtensor_empty(NULL, 2, f32, cpu, NULL, &t), DEVTENSOR_STATUS_NULL_POINTER, "`shape` is NULL");
    FAILS(devtensor_empty(shape, -1, f32, cpu, NULL, &t), DEVTENSOR_STATUS_INVALID_ARGUMENT, "ndim -1");
    FAILS(devtensor_empty(shape, 65, f32, cpu, NULL, &t), DEVTENSOR_STATUS_INVALID_ARGUMENT, "ndim 65");
    const int64_t negative[1] = {-3};
    FAILS(devtensor_zeros(negative, 1, f32, cpu, NULL, &t), DEVTENSOR_STATUS_INVALID_ARGUMENT, "negative size -3");
    const DLDataType f16x2 = {kDLFloat, 16, 2};
    FAILS(devtensor_empty(shape, 2, f16x2, cpu, NULL, &t), DEVTENSOR_STATUS_UNSUPPORTED_DTYPE, "lanes 2");
    const DLDevice nowhere = {(DLDeviceType)99, 0}, negative_id = {kDLCUDA, -1};
    FAILS(devtensor_empty(shape, 2, f32, nowhere, NULL, &t), DEVTENSOR_STATUS_UNSUPPORTED_DEVICE, "device type 99");
    FAILS(devtensor_empty(shape, 2, f32, negative_id, NULL, &t), DEVTENSOR_STATUS_UNSUPPORTED_DEVICE, "device id -1");
    FAILS(devtensor_empty(shape, 2, f32, cpu, (void *)0x10, &t), DEVTENSOR_STATUS_INVALID_ARGUMENT, "no streams");
    CHECK(t == NULL, "*out written by a failed call");
    FAILS(devtensor_copy(NULL, &transposed, NULL), DEVTENSOR_STATUS_NULL_POINTER, "devtensor_copy: `dst` is NULL");
    FAILS(devtensor_copy(&a->dl_tensor, NULL, NULL), DEVTENSOR_STATUS_NULL_POINTER, "`src` is NULL");
    FAILS(devtensor_copy(&a->dl_tensor, &e->dl_tensor, NULL), DEVTENSOR_STATUS_SHAPE_MISMATCH, "shape mismatch");
    DLTensor as_int = a->dl_tensor;
    as_int.dtype.code = kDLInt;
    FAILS(devtensor_copy(&as_int, &transposed, NULL), DEVTENSOR_STATUS_DTYPE_MISMATCH, "dtype mismatch");
    DLTensor no_data = transposed;
    no_data.data = NULL;
    FAILS(devtensor_copy(&a->dl_tensor, &no_data, NULL), DEVTENSOR_STATUS_INVALID_TENSOR, "null data");
    FAILS(devtensor_contiguous(&transposed, NULL, NULL), DEVTENSOR_STATUS_NULL_POINTER, "`out` is NULL");
    FAILS(devtensor_memory_stats(cpu, NULL), DEVTENSOR_STATUS_NULL_POINTER, "`out` is NULL");
    CHECK(strcmp(devtensor_status_name(DEVTENSOR_STATUS_OUT_OF_MEMORY), "DEVTENSOR_STATUS_OUT_OF_MEMORY") == 0,
          "status name");
    CHECK(strcmp(devtensor_status_name(12345), "DEVTENSOR_STATUS_UNKNOWN") == 0, "unknown status name");

    /* Streams: none on the CPU; per device and thread elsewhere (bookkeeping only, no GPU needed). */
    void *s = (void *)1;
    OK(devtensor_get_stream(cpu, &s));
    CHECK(s == NULL, "CPU stream %p", s);
    FAILS(devtensor_set_stream(cpu, (void *)0x10, NULL), DEVTENSOR_STATUS_INVALID_ARGUMENT, "no streams");
    FAILS(devtensor_get_stream(cpu, NULL), DEVTENSOR_STATUS_NULL_POINTER, "`out` is NULL");
    const DLDevice cuda1 = {kDLCUDA, 1};
    void *prev = (void *)1;
    OK(devtensor_set_stream(cuda1, (void *)0x1234, &prev));
    CHECK(prev == NULL, "first previous stream %p", prev);
    OK(devtensor_get_stream(cuda1, &s));
    CHECK(s == (void *)0x1234, "current stream %p", s);
    OK(devtensor_set_stream(cuda1, NULL, &prev));
    CHECK(prev == (void *)0x1234, "previous stream %p", prev);

    /* Every tensor handed out is freed by its deleter, once: nothing live, nothing allocated. */
    CHECK(devtensor_live_tensors() == live_before + 3, "%llu live tensors, expected 3",
          (unsigned long long)(devtensor_live_tensors() - live_before));
    free_tensor(a);
    free_tensor(c);
    free_tensor(e);
    CHECK(devtensor_live_tensors() == live_before, "tensors still live after their deleters");
    OK(devtensor_memory_stats(cpu, &after));
    CHECK(after.active_blocks == before.active_blocks && after.allocated == before.allocated,
          "CPU allocations: %llu blocks / %llu bytes before, %llu / %llu after",
          (unsigned long long)before.active_blocks, (unsigned long long)before.allocated,
          (unsigned long long)after.active_blocks, (unsigned long long)after.allocated);
    CHECK(after.alloc_count == before.alloc_count + 3, "%llu allocations, expected 3",
          (unsigned long long)(after.alloc_count - before.alloc_count));
    uint64_t released = 7;
    OK(devtensor_empty_cache(cpu, &released));
    CHECK(released == 0, "the CPU has no cache, released %llu", (unsigned long long)released);

    if (failures) return 1;
    printf("cpu_tensors: OK\n");
    return 0;
}
