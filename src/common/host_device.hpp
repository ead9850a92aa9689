// LOCKSTEP_HOST_DEVICE marks a function that both the host compiler and nvcc compile, for the
// host and, under nvcc, for the GPU too: math that the CPU and CUDA backends must compute alike
// (common/elementwise_math.hpp, the hash mixer of common/random.hpp). Such functions stay plain
// C++17, as .cu files are compiled as C++17.
#pragma once

#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#else
#define LOCKSTEP_HOST_DEVICE
#endif
