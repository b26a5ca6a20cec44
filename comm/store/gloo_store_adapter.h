// GlooStoreAdapter: lets Gloo's rendezvous (connectFullMesh) run over ddplab's Store.
//
// Gloo only needs set/get/wait from its store: each rank publishes its listening addresses and
// reads everyone else's. Gloo's own bytes are std::vector<char>, ours std::vector<uint8_t>; the
// adapter converts and forwards, so the keys land in whatever (Prefix)Store it wraps.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace ddplab::distributed {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<distributed::Store> store);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Gloo calls the one-argument form too; it waits for our store's timeout.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<distributed::Store> store_;
};

}  // namespace ddplab::distributed
