// The step every inference API shares, whatever the transport: hand a
// decoded request to ServerCore::predict_async and answer it once, on the
// thread that runs `done` (the batch thread, a compute thread, or the
// caller: server_core.h).
//
//   run_inference(core, handle, signature, std::move(inputs), deadline, parse_us,
//                 [](TensorMap& out) { return encode(out); },          // may throw
//                 [](const Status& s, const RequestTiming& t, Reply r) { ...send r or s... });
//
// `encode(outputs)` builds the answer (timed as serialize_us); `finish`
// gets OK and its result, or the error (the core's, or what encode threw)
// and a default-constructed result. An `encode` that returns void gives
// `finish(status, timing)`. Neither may block; `finish` must not throw.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/serving/core/server_core.h"
#include "kiln/serving/status.h"

namespace kiln::serving::api {

// Rethrows `error` or runs `encode`, timing it into t.serialize_us; the status.
template <class F>
Status encode_timed(const std::exception_ptr& error, RequestTiming& t, F encode) {
  try {
    if (error) std::rethrow_exception(error);
    const auto start = Clock::now();
    encode();
    t.serialize_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
    return Status::Ok();
  } catch (...) {
    return status_of_current_exception();
  }
}

template <class Encode, class Finish>
void run_inference(ServerCore& core, ServableHandlePtr handle, std::string signature, TensorMap inputs,
                   Deadline deadline, int64_t parse_us, Encode encode, Finish finish) {
  core.predict_async(std::move(handle), std::move(signature), std::move(inputs), deadline,
                     [parse_us, encode = std::move(encode), finish = std::move(finish)](
                         std::exception_ptr error, TensorMap outputs, const RequestTiming& timing) mutable {
                       RequestTiming t = timing;
                       t.parse_us = parse_us;
                       if constexpr (std::is_void_v<std::invoke_result_t<Encode&, TensorMap&>>) {
                         Status s = encode_timed(error, t, [&] { encode(outputs); });
                         finish(s, t);
                       } else {
                         std::invoke_result_t<Encode&, TensorMap&> result{};
                         Status s = encode_timed(error, t, [&] { result = encode(outputs); });
                         if (!s.ok()) result = {};
                         finish(s, t, std::move(result));
                       }
                     });
}

}  // namespace kiln::serving::api
