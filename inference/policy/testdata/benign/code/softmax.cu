// Row-wise softmax over a (rows, cols) half-precision matrix, one warp per row.
#include <cuda_fp16.h>
#include <cstdio>

constexpr int kWarp = 32;
constexpr int kRows = 4096;
constexpr int kCols = 1024;
constexpr int kThreadsPerBlock = 256;  // 8 warps

__global__ void softmax_rows(const __half* __restrict__ in, __half* __restrict__ out, int rows, int cols) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    int lane = threadIdx.x % kWarp;
    if (warp >= rows) return;
    const __half* x = in + (size_t)warp * cols;
    float m = -65504.0f;
    for (int c = lane; c < cols; c += kWarp) m = fmaxf(m, __half2float(x[c]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    float s = 0.0f;
    for (int c = lane; c < cols; c += kWarp) s += __expf(__half2float(x[c]) - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    for (int c = lane; c < cols; c += kWarp)
        out[(size_t)warp * cols + c] = __float2half(__expf(__half2float(x[c]) - m) / s);
}

int main() {
    size_t bytes = (size_t)kRows * kCols * sizeof(__half);  // 8,388,608 bytes
    __half *d_in, *d_out;
    cudaMalloc(&d_in, bytes);
    cudaMalloc(&d_out, bytes);
    dim3 block(kThreadsPerBlock);
    dim3 grid((kRows * kWarp + kThreadsPerBlock - 1) / kThreadsPerBlock);  // 512 blocks
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start);
    for (int i = 0; i < 100; i++) softmax_rows<<<grid, block>>>(d_in, d_out, kRows, kCols);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    printf("grid=(%d,1,1) block=(%d,1,1) avg %.4f ms, %.1f GB/s\n", grid.x, block.x, ms / 100, 2.0 * bytes / (ms / 100 * 1e6));
    // grid=(512,1,1) block=(256,1,1) avg 0.0113 ms, 1484.7 GB/s  (H100 80GB HBM3)
    return 0;
}
