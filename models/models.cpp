// The model zoo (see models/models.h).
#include "models/models.h"

#include <sstream>

namespace ddplab::models {

std::vector<std::string> available() {
  return {"resnet20", "resnet32", "resnet44", "resnet56", "resnet110",
          "resnet18", "resnet34", "resnet50", "cnn",      "mlp"};
}

std::shared_ptr<nn::Module> create(const std::string& name, int64_t num_classes,
                                   int64_t in_channels, int64_t image_size) {
  const int64_t size = image_size > 0 ? image_size : 28;
  for (int depth : {20, 32, 44, 56, 110}) {
    if (name == "resnet" + std::to_string(depth))
      return cifar_resnet(depth, num_classes, in_channels);
  }
  if (name == "resnet18") return resnet18(num_classes, in_channels);
  if (name == "resnet34") return resnet34(num_classes, in_channels);
  if (name == "resnet50") return resnet50(num_classes, in_channels);
  if (name == "cnn") return std::make_shared<SmallCNN>(num_classes, in_channels, size);
  if (name == "mlp") return std::make_shared<MLP>(num_classes, in_channels, size);
  std::ostringstream os;
  for (const auto& n : available()) os << " " << n;
  DDP_FAIL("models::create: unknown model '" << name << "'; available:" << os.str());
}

}  // namespace ddplab::models
