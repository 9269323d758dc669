#include "kiln/serving/frontend.h"

#include <cctype>
#include <mutex>

#include "kiln/core/error.h"

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

void FrontendOptions::validate() const {
  if (enable_admin && effective_admin_token().empty())
    throw ValueError(
        "admin routes (:load, :unload, config reload) need a token: give --admin_token_file FILE (or "
        "--bearer_token_file FILE) with --enable_admin_routes");
}

AdminCheck check_admin(const FrontendOptions& o, const std::string& authorization) {
  AdminCheck c;
  if (!o.enable_admin) {
    c.message =
        "admin routes are off; start kiln serve with --enable_admin_routes (and --admin_token_file) to use them";
    return c;
  }
  if (!bearer_token_matches(authorization, o.effective_admin_token())) {
    c.unauthenticated = true;
    c.message = "admin calls need \"Authorization: Bearer <admin token>\" (the token of --admin_token_file)";
    return c;
  }
  c.allowed = true;
  return c;
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
