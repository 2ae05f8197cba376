#pragma once
// Optimizers over chunk memory: Adam/AdamW/SGD on the CPU (AVX-512/AVX2/scalar, threaded), mixed precision with
// loss scaling and global-norm clipping, state checkpoints. The fused CUDA Adam is in
// <chunkwise/optim/cuda/adam.cuh> (nvcc only).
#include <chunkwise/optim/concepts.hpp>
#include <chunkwise/optim/convert.hpp>
#include <chunkwise/optim/cpu_adam.hpp>
#include <chunkwise/optim/cpu_isa.hpp>
#include <chunkwise/optim/cpu_options.hpp>
#include <chunkwise/optim/cpu_sgd.hpp>
#include <chunkwise/optim/hyperparameters.hpp>
#include <chunkwise/optim/loss_scaler.hpp>
#include <chunkwise/optim/mixed_precision.hpp>
#include <chunkwise/optim/schedule.hpp>
#include <chunkwise/optim/state_io.hpp>
