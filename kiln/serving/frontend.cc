#include "kiln/serving/frontend.h"

#include <cctype>
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

bool bearer_token_matches(const std::string& authorization, const std::string& token) {
  static const std::string scheme = "bearer ";
  if (token.empty() || authorization.size() != scheme.size() + token.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower((unsigned char)authorization[i]) != scheme[i]) return false;
  unsigned char diff = 0;  // no early exit: the time does not tell how much matched
  for (size_t i = 0; i < token.size(); ++i) diff |= (unsigned char)(authorization[scheme.size() + i] ^ token[i]);
  return diff == 0;
}

void register_grpc_frontend(FrontendFactory factory) {
  std::lock_guard<std::mutex> l(mu());
  slot() = std::make_unique<FrontendFactory>(std::move(factory));
}

const FrontendFactory* grpc_frontend_factory() {
  std::lock_guard<std::mutex> l(mu());
  return slot().get();
}

}  // namespace kiln::serving
