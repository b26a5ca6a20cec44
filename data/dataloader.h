// DataLoader: batches of a Dataset, assembled on background threads, in a seeded order.
//
//   auto train = std::make_shared<data::CIFAR10>(root, true,
//                                                data::Transform::cifar_train(data::cifar10_stats()));
//   data::DataLoaderOptions opts;
//   opts.batch_size = 128;
//   opts.shuffle = true;
//   opts.num_workers = 2;
//   data::DataLoader loader(train, opts);
//   for (int64_t epoch = 0; epoch < 10; ++epoch) {
//     loader.set_epoch(epoch);               // new shuffle and new augmentation each epoch
//     for (auto& batch : loader) { ... batch.images [128, 3, 32, 32], batch.labels [128] ... }
//   }
//
// Determinism: the batch order comes from the sampler (a function of (seed, epoch)) and the
// augmentation of sample i from its own Philox stream (seed, epoch, i) (data/sample_rng.h). So
// a given seed and epoch give bit-identical batches with 0, 1 or 8 workers.
//
// Workers: with num_workers = 0 the calling thread builds each batch inside next(). Otherwise
// num_workers threads build batches ahead, at most num_workers * prefetch_factor of them beyond
// the one the consumer waits for, and next() hands them out in order. A worker builds a batch by
// writing each sample straight into one preallocated [B, C, H, W] buffer (Dataset::get_into);
// with pin_memory that buffer is page-locked so `batch.to(cuda, true)` can copy asynchronously.
// An exception in a worker is rethrown by next(); the destructor stops and joins the workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "tensor/tensor.h"

namespace ddplab::data {

struct Batch {
  Tensor images;                 // float32 [B, C, H, W]
  Tensor labels;                 // int64 [B]
  std::vector<int64_t> indices;  // the dataset index of each sample
  int64_t batch_index = 0;       // position in the epoch

  // Both tensors on `device`; non_blocking copies from pinned memory are asynchronous. This
  // Batch may be dropped at once: the copy records an event on its pinned buffers, and the
  // pinned allocator hands them out again only after that event (tensor/cuda/cuda_allocator.h).
  Batch to(Device device, bool non_blocking = false) const;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;     // a RandomSampler(seed) when no sampler is given
  bool drop_last = false;   // drop the last batch when it would be smaller than batch_size
  int num_workers = 0;      // background threads; 0 = build batches in the calling thread
  int prefetch_factor = 2;  // batches each worker may build ahead of the consumer
  bool pin_memory = false;  // allocate batches in page-locked memory
  uint64_t seed = 0;        // the shuffle order and the augmentation randomness
  // Overrides `shuffle` (e.g. a DistributedSampler). The loader calls its set_epoch, so it is
  // not const.
  std::shared_ptr<Sampler> sampler;
};

// Where a loader stands within training (what a checkpoint records): the epoch and how many of
// its batches next() has handed out. Samplers are pure functions of the epoch, so these two
// numbers are the whole data position.
struct DataLoaderState {
  int64_t epoch = 0;
  int64_t batches_yielded = 0;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The epoch the next begin_epoch() (or range-for) runs: it picks the shuffle order and the
  // augmentation. The epoch lives in the sampler (PyTorch's sampler.set_epoch): this sets it
  // there, and a user's own sampler->set_epoch(e) works the same (the last call wins).
  void set_epoch(int64_t epoch) { sampler_->set_epoch(epoch); }
  int64_t epoch() const { return sampler_->epoch(); }
  const Sampler& sampler() const { return *sampler_; }
  // Batches per epoch (len(loader) in PyTorch).
  int64_t size() const;
  const DataLoaderOptions& options() const { return opts_; }
  const Dataset& dataset() const { return *dataset_; }

  // Starts (or restarts) epoch epoch(); batches of an unfinished epoch are dropped.
  void begin_epoch();
  void begin_epoch(int64_t epoch) {
    set_epoch(epoch);
    begin_epoch();
  }
  // The next batch of the current epoch, or nullopt at its end. Starts an epoch if none is.
  std::optional<Batch> next();

  // The position to save (torchdata's StatefulDataLoader names). After load_state_dict, the next
  // begin_epoch() of that epoch (e.g. the range-for) skips the batches already yielded, without
  // building them; other epochs start at batch 0 as usual.
  DataLoaderState state_dict() const;
  void load_state_dict(const DataLoaderState& state);

  // Range-for support: `for (auto& batch : loader)` runs one epoch (begin() calls begin_epoch()).
  class Iterator {
   public:
    Iterator(DataLoader* loader, std::optional<Batch> batch)
        : loader_(loader), batch_(std::move(batch)) {}
    Batch& operator*() { return *batch_; }
    Batch* operator->() { return &*batch_; }
    Iterator& operator++() {
      batch_ = loader_->next();
      return *this;
    }
    bool operator!=(const Iterator& o) const { return batch_.has_value() != o.batch_.has_value(); }

   private:
    DataLoader* loader_;
    std::optional<Batch> batch_;
  };
  Iterator begin();
  Iterator end() { return Iterator(this, std::nullopt); }

 private:
  // What one epoch visits: fixed when it begins, shared read-only with the workers.
  struct Plan {
    std::vector<int64_t> indices;
    int64_t num_batches = 0;
    int64_t epoch = 0;
  };
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };

  Batch build_batch(const Plan& plan, int64_t b) const;
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opts_;
  std::shared_ptr<Sampler> sampler_;
  DataLoaderState resume_;  // a loaded position, consumed by begin_epoch of resume_.epoch
  bool resume_pending_ = false;

  // Shared with the workers, under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;   // a worker may take a batch, or must stop
  std::condition_variable ready_cv_;  // a batch (or an error) is ready
  std::shared_ptr<const Plan> plan_;
  uint64_t generation_ = 0;  // bumped by begin_epoch so late batches of an old epoch are dropped
  int64_t next_to_make_ = 0;
  int64_t next_to_yield_ = 0;
  std::map<int64_t, Result> ready_;  // finished batches by position, waiting for the consumer
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ddplab::data
