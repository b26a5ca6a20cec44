// ddplab in one include, as libtorch's <torch/torch.h>: a program's first line can be
//
//   #include <ddplab/ddplab.h>
//
// and it has every public header below, whatever file a declaration moves to later. The headers
// keep the paths the library's own sources use (`#include "ddp/ddp.h"`), which a program
// may also include one by one. Installed as <prefix>/include/ddplab/ddplab.h; pkg-config's
// --cflags gives both <prefix>/include (for this file) and <prefix>/include/ddplab (for the rest).
#pragma once

// Tensors and their operations, on the CPU and (in a CUDA build) the GPU.
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
#include "tensor/threads.h"

// Automatic differentiation: the differentiable operations (ddplab::add, matmul, relu, ...),
// the engine, custom ops (record), gradient checks.
#include "autograd/engine.h"
#include "autograd/function_node.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

// Layers, their functions, parameters on disk.
#include "nn/autocast.h"
#include "nn/checkpoint.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/safetensors.h"
#include "nn/sync_batchnorm.h"

// Optimizers, schedules, gradient clipping and scaling.
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

// Data: datasets in their files, transforms, samplers (each rank's share too), the loader.
#include "data/cifar.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/distributed_sampler.h"
#include "data/image_folder.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/transforms.h"

// Communication: process groups, init_process_group, Join, small values over a group.
#include "comm/collectives.h"
#include "comm/init_process_group.h"
#include "comm/join.h"
#include "comm/process_group.h"

// Data parallelism: DDP and its communication hooks, ZeRO, sharded evaluation.
#include "ddp/comm_hook.h"
#include "ddp/ddp.h"
#include "ddp/evaluate.h"
#include "ddp/zero_redundancy_optimizer.h"

// The models of the examples and the labs.
#include "models/models.h"
#include "models/resnet.h"
#include "models/simple.h"
