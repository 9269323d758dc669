#include "kiln/serving/frontend.h"

#include <mutex>

namespace kiln::serving {
namespace {
std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::unique_ptr<FrontendFactory>& slot() {
  static std::unique_ptr<FrontendFactory> f;
  return f;
}
}  // namespace

void register_grpc_frontend(FrontendFactory factory) {
  std::lock_guard<std::mutex> l(mu());
  slot() = std::make_unique<FrontendFactory>(std::move(factory));
}

const FrontendFactory* grpc_frontend_factory() {
  std::lock_guard<std::mutex> l(mu());
  return slot().get();
}

}  // namespace kiln::serving
