// Config files in protobuf text format (TF Serving's --model_config_file,
// --batching_parameters_file, --ssl_config_file), read by libprotobuf's
// TextFormat into the generated message, with one kiln-style error:
//
//   tensorflow::serving::SSLConfig c;
//   parse_text_proto(text, "--ssl_config_file ssl.config", &c);
//   // ValueError "--ssl_config_file ssl.config: line 2, column 1: unknown
//   //   field `server_crt` in SSLConfig; expected one of: server_key, ..."
//
// Thread-safe (no shared state).
#pragma once

#include <map>
#include <string>

#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

namespace kiln::serving {

struct TextProtoOptions {
  // A quoted string may hold raw line breaks (PEM blocks pasted into an
  // SSLConfig); TextFormat itself refuses them.
  bool allow_multiline_strings = false;
  // Per message type (full name): the noun for its fields in "unknown ..."
  // errors, e.g. "version policy" for a oneof-only message.
  std::map<std::string, std::string> field_nouns;
};

// Parses `text` into `message` (cleared first). Unknown fields, bad syntax
// and bad values throw ValueError "<source>: line L, column C: <problem>"
// (the first problem; 1-based). `info`, when given, receives each field's
// location, for errors the caller finds after parsing.
void parse_text_proto(const std::string& text, const std::string& source, google::protobuf::Message* message,
                      google::protobuf::TextFormat::ParseInfoTree* info = nullptr,
                      const TextProtoOptions& options = {});

// "<source>: line L, column C" for a location from a ParseInfoTree
// (0-based, as TextFormat records it); just `source` when unknown (-1).
std::string text_proto_location(const std::string& source, const google::protobuf::TextFormat::ParseLocation& where);

}  // namespace kiln::serving
