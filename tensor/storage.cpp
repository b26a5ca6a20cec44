// Storage allocation through the device's caching allocator.
#include "tensor/storage.h"

namespace ddplab {

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

}  // namespace ddplab
