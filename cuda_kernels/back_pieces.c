// The driver calls of one job of reserved_rows' helper thread (sok1x/backend/cuda/reserved_rows.py:
// back_rows_ahead), made in one call from Python. ctypes lets go of the GIL around a foreign call,
// and a thread that wants it back waits while the main thread runs Python: one call a driver
// function took the helper 63.6 ms for a group's 26 members beside a thread queuing kernels, and
// 10.2 ms beside an idle one (bench/back_ahead.py, one H200, 2026-11-28). One call a job takes it
// back once.
//
// Host code only, built by the kernels' compile helper (compiler.host_library) with nvcc's host
// compiler. It links against nothing but libc: the driver's functions come as addresses that
// reserved_rows takes from libcuda through ctypes.
#include <stddef.h>
#include <stdint.h>

// The driver functions a job calls (CUresult is an int; CUdeviceptr, the allocation handle and the
// flags are 64-bit; the properties and the access description are the driver's structs).
struct sok1x_driver_calls {
  int (*mem_create)(uint64_t *handle, size_t bytes, const void *prop, uint64_t flags);
  int (*mem_map)(uint64_t where, size_t bytes, size_t offset, uint64_t handle, uint64_t flags);
  int (*mem_set_access)(uint64_t where, size_t bytes, const void *access, size_t count);
  int (*mem_unmap)(uint64_t where, size_t bytes);
  int (*mem_release)(uint64_t handle);
  int (*memset_d8_async)(uint64_t where, unsigned char value, size_t count, void *stream);
  int (*memset_d32_async)(uint64_t where, unsigned int value, size_t count, void *stream);
};

enum { STAGE_CREATE = 0, STAGE_MAP = 1, STAGE_ACCESS = 2, STAGE_FILL = 3 };
enum { FILL_ZEROS = 1, FILL_WORDS = 2 };

static void give_back(const struct sok1x_driver_calls *d, int64_t count, const uint64_t *where,
                      const uint64_t *bytes, const uint64_t *handles) {
  for (int64_t i = count - 1; i >= 0; --i) {
    d->mem_unmap(where[i], bytes[i]);
    d->mem_release(handles[i]);
  }
}

// Backs pieces [0, pieces): device memory of bytes[i] created with `prop`, mapped at where[i] and
// opened to the device with `access`; its handle goes to handles[i]. Then queues each fill f on
// `stream`: fill_bytes[f] bytes at fill_where[f] set to zeros (FILL_ZEROS) or to the 32-bit word
// fill_words[f] in every word (FILL_WORDS).
// Returns 0, or the failing call's CUresult with failed[0] its stage (STAGE_*) and failed[1] its
// piece or fill. A piece that fails is given back, and so is every piece made before it; after a
// failed fill every piece stays mapped (fills may be queued on them: the caller waits for
// `stream`, then gives them back).
int sok1x_back_pieces(const struct sok1x_driver_calls *d, int64_t pieces, const uint64_t *where,
                      const uint64_t *bytes, const void *prop, const void *access,
                      uint64_t *handles, int64_t fills, const uint64_t *fill_where,
                      const uint64_t *fill_bytes, const uint32_t *fill_words,
                      const int32_t *fill_kinds, void *stream, int64_t *failed) {
  for (int64_t i = 0; i < pieces; ++i) {
    int result = d->mem_create(&handles[i], bytes[i], prop, 0);
    int stage = STAGE_CREATE;
    if (result == 0) {
      stage = STAGE_MAP;
      result = d->mem_map(where[i], bytes[i], 0, handles[i], 0);
      if (result == 0) {
        stage = STAGE_ACCESS;
        result = d->mem_set_access(where[i], bytes[i], access, 1);
        if (result != 0) d->mem_unmap(where[i], bytes[i]);
      }
      if (result != 0) d->mem_release(handles[i]);
    }
    if (result != 0) {
      give_back(d, i, where, bytes, handles);
      failed[0] = stage;
      failed[1] = i;
      return result;
    }
  }
  for (int64_t f = 0; f < fills; ++f) {
    int result = 0;
    if (fill_kinds[f] == FILL_ZEROS) {
      result = d->memset_d8_async(fill_where[f], 0, fill_bytes[f], stream);
    } else if (fill_kinds[f] == FILL_WORDS) {
      result = d->memset_d32_async(fill_where[f], fill_words[f], fill_bytes[f] / 4, stream);
    }
    if (result != 0) {
      failed[0] = STAGE_FILL;
      failed[1] = f;
      return result;
    }
  }
  return 0;
}
