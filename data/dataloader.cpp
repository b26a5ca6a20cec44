// DataLoader: epoch plans, batch assembly, and the worker threads' ordered prefetch queue.
#include "data/dataloader.h"

#include <algorithm>

#include "tensor/allocator.h"
#include "tensor/ops.h"

namespace ddplab::data {

namespace {

// A contiguous CPU tensor, in page-locked memory when `pinned` (for async copies to a GPU).
Tensor new_tensor(const Shape& shape, DType dtype, bool pinned) {
  if (!pinned) return ops::empty(shape, dtype);
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * element_size(dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage(allocate_pinned(nbytes), nbytes, kCPU);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

Batch Batch::to(Device device, bool non_blocking) const {
  Batch out;
  out.images = ops::to(images, device, non_blocking);
  out.labels = ops::to(labels, device, non_blocking);
  out.indices = indices;
  out.batch_index = batch_index;
  return out;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opts_(std::move(options)) {
  DDP_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  DDP_CHECK(opts_.batch_size > 0,
            "DataLoader: batch_size must be positive, got " << opts_.batch_size);
  DDP_CHECK(opts_.num_workers >= 0,
            "DataLoader: num_workers must be >= 0, got " << opts_.num_workers);
  DDP_CHECK(opts_.prefetch_factor >= 1,
            "DataLoader: prefetch_factor must be >= 1, got " << opts_.prefetch_factor);
  if (opts_.sampler) {
    sampler_ = opts_.sampler;
  } else if (opts_.shuffle) {
    sampler_ = std::make_shared<RandomSampler>(dataset_->size(), opts_.seed);
  } else {
    sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  }
  for (int w = 0; w < opts_.num_workers; ++w) workers_.emplace_back([this] { worker_loop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size();
  return opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
}

void DataLoader::begin_epoch() {
  auto plan = std::make_shared<Plan>();
  plan->epoch = sampler_->epoch();
  plan->indices = sampler_->indices(plan->epoch);
  const auto n = static_cast<int64_t>(plan->indices.size());
  plan->num_batches =
      opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
  int64_t first = 0;
  if (resume_pending_ && resume_.epoch == plan->epoch) {
    first = std::min(resume_.batches_yielded, plan->num_batches);
    resume_pending_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    plan_ = std::move(plan);
    ready_.clear();
    next_to_make_ = first;
    next_to_yield_ = first;
  }
  work_cv_.notify_all();
}

DataLoaderState DataLoader::state_dict() const {
  // next_to_yield_ is written only by the consumer's thread, the one calling this.
  if (resume_pending_) return resume_;
  if (!plan_) return {sampler_->epoch(), 0};
  return {plan_->epoch, next_to_yield_};
}

void DataLoader::load_state_dict(const DataLoaderState& state) {
  DDP_CHECK(state.epoch >= 0 && state.batches_yielded >= 0,
            "DataLoader::load_state_dict: invalid position (epoch "
                << state.epoch << ", batch " << state.batches_yielded << ")");
  sampler_->set_epoch(state.epoch);
  resume_ = state;
  resume_pending_ = true;
  // Forget the epoch in progress, so the next next() begins the resumed one.
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  plan_.reset();
  ready_.clear();
}

DataLoader::Iterator DataLoader::begin() {
  begin_epoch();
  return Iterator(this, next());
}

Batch DataLoader::build_batch(const Plan& plan, int64_t b) const {
  const int64_t first = b * opts_.batch_size;
  const int64_t count =
      std::min<int64_t>(opts_.batch_size, static_cast<int64_t>(plan.indices.size()) - first);
  Shape sample = dataset_->sample_shape();
  const int64_t per_sample = shape_numel(sample);
  Shape shape{count};
  shape.insert(shape.end(), sample.begin(), sample.end());

  Batch batch;
  batch.batch_index = b;
  batch.images = new_tensor(shape, kFloat32, opts_.pin_memory);
  batch.labels = new_tensor({count}, kInt64, opts_.pin_memory);
  batch.indices.assign(plan.indices.begin() + first, plan.indices.begin() + first + count);
  float* images = batch.images.data_ptr<float>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = batch.indices[static_cast<size_t>(k)];
    DDP_CHECK(index >= 0 && index < dataset_->size(), "DataLoader: the sampler gave index "
                                                          << index << " for a dataset of "
                                                          << dataset_->size());
    // The randomness is keyed by the dataset index, not the batch slot, so it does not depend
    // on the shuffle order or on which worker builds the batch.
    labels[k] = dataset_->get_into(
        index, images + k * per_sample,
        SampleRng(opts_.seed, static_cast<uint64_t>(plan.epoch), static_cast<uint64_t>(index)));
  }
  return batch;
}

std::optional<Batch> DataLoader::next() {
  if (!plan_) begin_epoch();
  if (workers_.empty()) {
    // num_workers = 0: no other thread touches the state, no lock needed.
    if (next_to_yield_ >= plan_->num_batches) return std::nullopt;
    const int64_t b = next_to_yield_++;
    try {
      return build_batch(*plan_, b);
    } catch (...) {
      next_to_yield_ = plan_->num_batches;  // the epoch ends with the error
      throw;
    }
  }
  Result r;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (next_to_yield_ >= plan_->num_batches) return std::nullopt;
    ready_cv_.wait(lock, [&] { return ready_.count(next_to_yield_) > 0; });
    auto it = ready_.find(next_to_yield_);
    r = std::move(it->second);
    ready_.erase(it);
    ++next_to_yield_;
    if (r.error) {
      // Stop the epoch: workers take no more of its batches; ones in flight are dropped.
      ++generation_;
      next_to_make_ = next_to_yield_ = plan_->num_batches;
      ready_.clear();
    }
  }
  work_cv_.notify_all();  // the window moved: a worker may start one more batch
  if (r.error) std::rethrow_exception(r.error);
  return std::move(r.batch);
}

void DataLoader::worker_loop() {
  const int64_t window = static_cast<int64_t>(opts_.num_workers) * opts_.prefetch_factor;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (plan_ && next_to_make_ < plan_->num_batches &&
                       next_to_make_ < next_to_yield_ + window);
    });
    if (stop_) return;
    std::shared_ptr<const Plan> plan = plan_;
    const int64_t b = next_to_make_++;
    const uint64_t generation = generation_;
    lock.unlock();
    Result r;
    try {
      r.batch = build_batch(*plan, b);
    } catch (...) {
      r.error = std::current_exception();
    }
    lock.lock();
    if (generation == generation_) {
      ready_.emplace(b, std::move(r));
      ready_cv_.notify_all();
    }
  }
}

}  // namespace ddplab::data
