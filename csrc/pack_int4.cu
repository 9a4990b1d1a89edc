// int8 codes <-> packed int4 (two codes per byte, cutlass::int4b_t RowMajor order: element 2j in
// the low nibble of byte j, element 2j+1 in the high nibble), for the Ampere int4 GEMM.
#include "hot_kernels.h"
#include "launch_util.h"

namespace hot {
namespace {

constexpr int kThreads = 256;

// One thread per output byte; rows are independent, so a 2-D grid (bytes, rows) avoids 64-bit
// division. Codes at k >= kvalid are padding and packed as 0.
__global__ void pack_int4_kernel(const int8_t* __restrict__ codes, int64_t kvalid, int64_t ld_codes,
                                 uint8_t* __restrict__ packed, int64_t nbytes, int64_t rows, int* bad_flag) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t r = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (j >= nbytes || r >= rows) return;
  const int8_t* row = codes + r * ld_codes;
  const int64_t k0 = 2 * j;
  const int lo = k0 < kvalid ? row[k0] : 0;
  const int hi = k0 + 1 < kvalid ? row[k0 + 1] : 0;
  if (bad_flag != nullptr && (lo < -8 || lo > 7 || hi < -8 || hi > 7)) *bad_flag = 1;
  packed[r * nbytes + j] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
}

__global__ void unpack_int4_kernel(const uint8_t* __restrict__ packed, int64_t k, int64_t ld_packed,
                                   int64_t rows, int8_t* __restrict__ codes) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t r = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (j >= k || r >= rows) return;
  const uint8_t byte = packed[r * ld_packed + j / 2];
  const int nib = (j & 1) ? (byte >> 4) : (byte & 0xF);
  codes[r * k + j] = int8_t(nib >= 8 ? nib - 16 : nib);  // sign-extend the 4-bit two's complement
}

// Rows cover y * z >= rows blocks with y <= 65535 (the grid's y limit); the kernels skip the excess.
dim3 grid_for(int64_t cols, int64_t rows) {
  int64_t gy = rows < 65535 ? rows : 65535;
  int64_t gz = gy ? (rows + gy - 1) / gy : 0;
  return dim3(unsigned((cols + kThreads - 1) / kThreads), unsigned(gy), unsigned(gz));
}

}  // namespace

const char* pack_int4(const int8_t* codes, int64_t rows, int64_t k, int64_t ld_codes, uint8_t* packed,
                      int64_t kpad, int* bad_flag, cudaStream_t stream) {
  if (kpad % 2 != 0 || kpad < k) return "pack_int4: padded K must be even and >= K";
  const int64_t nbytes = kpad / 2;
  if (rows == 0 || nbytes == 0) return nullptr;
  pack_int4_kernel<<<grid_for(nbytes, rows), kThreads, 0, stream>>>(codes, k, ld_codes, packed, nbytes, rows, bad_flag);
  return last_launch_error();
}

const char* unpack_int4(const uint8_t* packed, int64_t rows, int64_t k, int64_t ld_packed_bytes, int8_t* codes,
                        cudaStream_t stream) {
  if (rows == 0 || k == 0) return nullptr;
  unpack_int4_kernel<<<grid_for(k, rows), kThreads, 0, stream>>>(packed, k, ld_packed_bytes, rows, codes);
  return last_launch_error();
}

}  // namespace hot
