// Helpers for the serving tests: tiny models saved into version directories,
// a core + REST server on loopback, and a JSON client.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/serving/httplib.h"
#include "kiln/serving/rest_server.h"
#include "kiln/serving/server_core.h"
#include "kiln/testing/testing.h"

namespace kiln::serving::testing {

// Sequential(Input(4) -> Dense(3)) with every weight = `fill`, saved at dir.
inline ModelPtr save_tiny_model(const std::string& dir, float fill) {
  auto m = std::make_shared<Sequential>();
  m->add(Input({4}));
  m->add(std::make_shared<Dense>(3));
  for (auto& w : m->weights()) w->value().data().fill_(fill);
  m->save(dir);
  return m;
}

// Expected output of save_tiny_model(fill) for one row x: fill*sum(x)+fill per unit.
inline float tiny_output(float fill, const std::vector<float>& x) {
  float s = 0;
  for (float v : x) s += v;
  return fill * s + fill;
}

inline std::string input_name(const ServableHandle& h) {
  return h.signatures()["serving_default"]["inputs"].begin().key();
}

struct Served {
  std::unique_ptr<ServerCore> core;
  std::unique_ptr<RestServer> rest;
  int port = 0;
  explicit Served(ServerCoreOptions o, FrontendOptions f = {}) {
    core = std::make_unique<ServerCore>(std::move(o));
    core->start();
    rest = std::make_unique<RestServer>(*core, f);
    port = rest->start();
  }
  ~Served() {
    rest->stop();
    core.reset();
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(30, 0);
    return c;
  }
};

inline ModelConfig model_config(const std::string& name, const std::string& base) {
  ModelConfig m;
  m.name = name;
  m.base_path = base;
  return m;
}

}  // namespace kiln::serving::testing
