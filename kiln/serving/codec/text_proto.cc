#include "kiln/serving/codec/text_proto.h"

#include <cctype>
#include <regex>
#include <set>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>

#include "kiln/core/error.h"

namespace kiln::serving {
namespace {

namespace pb = google::protobuf;

// Keeps the first problem TextFormat reports (it stops there; the tokenizer
// may add more about the same spot).
class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (has_error) return;
    has_error = true;
    this->line = line;
    this->column = column;
    this->message = message;
  }
  bool has_error = false;
  int line = -1;
  int column = -1;
  std::string message;
};

// A raw line break inside a quoted string becomes `\n` + end of the literal,
// and the next line reopens it: adjacent literals concatenate, and every
// field keeps its line number.
std::string escape_multiline_strings(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (comment) {
      comment = c != '\n';
    } else if (!quote) {
      if (c == '#') comment = true;
      if (c == '"' || c == '\'') quote = c;
    } else if (c == '\\' && i + 1 < text.size()) {
      out += c;
      c = text[++i];
    } else if (c == quote) {
      quote = 0;
    } else if (c == '\n') {
      out += std::string("\\n") + quote + '\n' + quote;
      continue;
    }
    out += c;
  }
  return out;
}

std::string short_name(const std::string& full_name) {
  const auto* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(full_name);
  return d ? d->name() : full_name;
}

std::string field_list(const pb::Descriptor* d) {
  std::string out;
  for (int i = 0; i < d->field_count(); ++i) out += (i ? ", " : "") + d->field(i)->name();
  return out;
}

// The message field named `name` anywhere below `root` (nullptr if none).
const pb::FieldDescriptor* find_message_field(const pb::Descriptor* root, const std::string& name) {
  std::vector<const pb::Descriptor*> todo{root};
  std::set<const pb::Descriptor*> seen{root};
  while (!todo.empty()) {
    const pb::Descriptor* d = todo.back();
    todo.pop_back();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
      if (f->name() == name) return f;
      if (seen.insert(f->message_type()).second) todo.push_back(f->message_type());
    }
  }
  return nullptr;
}

// The identifier before `name:` that ends just before (line, column), both
// 0-based; TextFormat's columns count a tab up to the next multiple of 8.
// `back`: how many characters before (line, column) it starts.
std::string field_before(const std::string& text, int line, int column, size_t* back = nullptr) {
  size_t pos = 0;
  for (int l = 0; l < line && pos != std::string::npos; ++l) {
    pos = text.find('\n', pos);
    if (pos != std::string::npos) ++pos;
  }
  if (pos == std::string::npos) return "";
  for (int col = 0; col < column && pos < text.size() && text[pos] != '\n'; ++pos)
    col = text[pos] == '\t' ? col + 8 - col % 8 : col + 1;
  size_t end = pos;
  while (end > 0 && std::isspace((unsigned char)text[end - 1])) --end;
  if (end > 0 && text[end - 1] == ':') --end;
  while (end > 0 && std::isspace((unsigned char)text[end - 1])) --end;
  size_t begin = end;
  while (begin > 0 && (std::isalnum((unsigned char)text[begin - 1]) || text[begin - 1] == '_')) --begin;
  if (back) *back = pos - begin;
  return text.substr(begin, end - begin);
}

// TextFormat's message, reworded where kiln can say more (the fields a type
// has, how a message field is written); otherwise as TextFormat wrote it.
// An unknown field's error moves back to the field's name (TextFormat reports
// the token after it).
std::string describe(FirstError& e, const std::string& text, const pb::Descriptor* root,
                     const TextProtoOptions& options) {
  static const std::regex unknown_field(R"re(Message type "([\w.]+)" has no field named "(\w+)"\.)re");
  static const std::regex expected_brace(R"re(Expected "\{", found "(.*)"\.)re");
  std::smatch m;
  if (std::regex_match(e.message, m, unknown_field)) {
    const auto* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(m[1]);
    auto noun = options.field_nouns.find(m[1]);
    std::string out = noun != options.field_nouns.end() ? "unknown " + noun->second + " `" + m[2].str() + "`"
                                                        : "unknown field `" + m[2].str() + "` in " + short_name(m[1]);
    if (d) out += "; expected one of: " + field_list(d);
    size_t back = 0;
    if (field_before(text, e.line, e.column, &back) == m[2].str() && back <= (size_t)e.column) e.column -= (int)back;
    return out;
  }
  if (std::regex_match(e.message, m, expected_brace)) {
    std::string name = field_before(text, e.line, e.column);
    const pb::FieldDescriptor* f = name.empty() ? nullptr : find_message_field(root, name);
    if (f) {
      bool wrapper = f->message_type()->file()->name() == "google/protobuf/wrappers.proto";
      return "`" + name + "` is a message, found \"" + m[1].str() + "\"; write `" + name +
             (wrapper ? " { value: ... }`" : " { ... }`");
    }
  }
  if (e.message == "Expected identifier, got: ") return "unexpected end of file: missing '}'";
  std::string out = e.message;
  if (!out.empty()) out[0] = static_cast<char>(std::tolower((unsigned char)out[0]));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

}  // namespace

std::string text_proto_location(const std::string& source, const pb::TextFormat::ParseLocation& where) {
  if (where.line < 0) return source;
  return source + ": line " + std::to_string(where.line + 1) + ", column " + std::to_string(where.column + 1);
}

void parse_text_proto(const std::string& text, const std::string& source, pb::Message* message,
                      pb::TextFormat::ParseInfoTree* info, const TextProtoOptions& options) {
  const std::string input = options.allow_multiline_strings ? escape_multiline_strings(text) : text;
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (info) parser.WriteLocationsTo(info);
  if (parser.ParseFromString(input, message)) return;
  if (!errors.has_error) throw ValueError(source + ": not a valid " + message->GetDescriptor()->name());
  const std::string problem = describe(errors, input, message->GetDescriptor(), options);
  throw ValueError(text_proto_location(source, {errors.line, errors.column}) + ": " + problem);
}

}  // namespace kiln::serving
