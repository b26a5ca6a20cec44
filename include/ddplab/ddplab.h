// ddplab in one include, as libtorch's <torch/torch.h>: a program's first line can be
//
//   #include <ddplab/ddplab.h>
//
// and it has every public header below, whatever file a declaration moves to later. The headers
// keep the paths the library's own sources use (`#include "distributed/ddp.h"`), which a program
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

// Automatic differentiation.
#include "autograd/engine.h"
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

// Data: datasets in their files, transforms, samplers, the loader.
#include "data/cifar.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/transforms.h"

// Distributed training: process groups, DDP, its sampler, Join, ZeRO, sharded evaluation.
#include "distributed/collectives.h"
#include "distributed/comm_hook.h"
#include "distributed/ddp.h"
#include "distributed/evaluate.h"
#include "distributed/init_process_group.h"
#include "distributed/join.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "distributed/zero_redundancy_optimizer.h"

// The models of the examples and the labs.
#include "models/models.h"
#include "models/resnet.h"
#include "models/simple.h"
