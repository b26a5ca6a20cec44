// GlooStoreAdapter: byte-vector conversion between Gloo's store interface and ours.
#include "comm/store/gloo_store_adapter.h"

#include <utility>

namespace ddplab::distributed {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<distributed::Store> store)
    : store_(std::move(store)) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  std::vector<uint8_t> v = store_->get(key);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  store_->wait(keys);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace ddplab::distributed
