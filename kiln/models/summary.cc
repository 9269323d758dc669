// Model::summary: Keras 3's table.
#include <functional>
#include <iomanip>
#include <sstream>

#include "kiln/core/string_tensor.h"
#include "kiln/models/functional.h"
#include "kiln/models/model.h"

namespace kiln {
namespace {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n), out;
  int c = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (c && c % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++c;
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << b << " " << units[u];
  return os.str();
}

// Pads/truncates to `w` display columns (the text is ASCII).
std::string cell(const std::string& s, size_t w, bool right = false) {
  std::string t = s.size() > w ? s.substr(0, w - 1) + "~" : s;
  std::string pad(w - t.size(), ' ');
  return right ? pad + t : t + pad;
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

int64_t bytes_of(const std::vector<VariablePtr>& vs) {
  int64_t b = 0;
  for (auto& v : vs) b += v->value().numel() * (int64_t)v->value().element_size();
  return b;
}

}  // namespace

std::string models::Model::summary_string(int line_length) {
  auto* functional = dynamic_cast<models::FunctionalImpl*>(this);
  std::vector<std::string> headers = {"Layer (type)", "Output Shape", "Param #"};
  std::vector<size_t> widths = {33, 24, 15};
  if (functional) {
    headers.push_back("Connected to");
    widths = {27, 20, 11, 24};
  }
  if (line_length > 0) {
    size_t total = 0;
    for (auto w : widths) total += w;
    for (auto& w : widths) w = std::max<size_t>(8, w * (size_t)line_length / total);
  }
  std::vector<std::vector<std::string>> rows;
  // Output shapes: a Functional model knows them from tracing; others are
  // computed by walking the layers from the input shape when it is known.
  std::vector<Shape> shapes = input_shapes();
  const std::vector<Shape> shapes_in = shapes;
  std::map<std::string, std::string> connected;
  if (functional) {
    auto cfg = functional->get_config();
    for (auto& lj : cfg["layers"]) {
      std::string c;
      // Inbound nodes hold Keras 3's __keras_tensor__ objects (lists of them
      // for a layer called on a list).
      std::function<void(const Json&)> add = [&](const Json& a) {
        if (a.is_array()) {
          for (auto& x : a) add(x);
          return;
        }
        const Json& h = a["config"]["keras_history"];
        c += (c.empty() ? "" : ", ") + h[0].get<std::string>() + "[" + std::to_string(h[1].get<int>()) + "][" +
             std::to_string(h[2].get<int>()) + "]";
      };
      for (auto& node : lj["inbound_nodes"]) add(node["args"]);
      connected[lj["name"].get<std::string>()] = c.empty() ? "-" : c;
    }
  }
  for (auto& l : layers()) {
    std::string out_shape = "?";
    if (!shapes.empty() && l->built() && !functional) {
      try {
        shapes = l->compute_output_shape(shapes);
        out_shape = shapes.size() == 1 ? shape_to_string(shapes[0]) : "";
        if (shapes.size() > 1)
          for (auto& s : shapes) out_shape += (out_shape.empty() ? "" : ", ") + shape_to_string(s);
      } catch (const std::exception&) {
        shapes.clear();
      }
    } else if (functional) {
      if (auto in = std::dynamic_pointer_cast<layers::InputLayerImpl>(l)) {
        out_shape = shape_to_string(in->batch_shape());
        if (is_string_dtype(in->input_dtype())) out_shape += " string";
      } else {
        try {
          out_shape = "";
          auto outs = l->compute_output_shape(l->build_input_shapes());
          for (auto& s : outs) out_shape += (out_shape.empty() ? "" : ", ") + shape_to_string(s);
        } catch (const std::exception&) {
          out_shape = "?";
        }
      }
    }
    std::vector<std::string> row = {l->name() + " (" + l->class_name() + ")", out_shape,
                                    with_commas(l->count_params())};
    if (functional) row.push_back(connected.count(l->name()) ? connected[l->name()] : "-");
    rows.push_back(row);
  }
  std::ostringstream os;
  os << "Model: \"" << name() << "\"\n";
  auto line = [&](const char* l, const char* m, const char* r, const char* fill) {
    os << l;
    for (size_t i = 0; i < widths.size(); ++i) os << repeat(fill, widths[i] + 2) << (i + 1 < widths.size() ? m : r);
    os << "\n";
  };
  auto text_row = [&](const std::vector<std::string>& cells, const char* sep) {
    os << sep;
    for (size_t i = 0; i < widths.size(); ++i) os << " " << cell(cells[i], widths[i], i == 2) << " " << sep;
    os << "\n";
  };
  line("┏", "┳", "┓", "━");
  text_row(headers, "┃");
  line("┡", "╇", "┩", "━");
  for (size_t i = 0; i < rows.size(); ++i) {
    text_row(rows[i], "│");
    if (i + 1 < rows.size()) line("├", "┼", "┤", "─");
  }
  line("└", "┴", "┘", "─");
  if (!functional) {  // Sequential lists no InputLayer row: name string inputs here
    const auto dtypes = input_dtypes();
    for (size_t i = 0; i < dtypes.size() && i < shapes_in.size(); ++i)
      if (is_string_dtype(dtypes[i])) os << " Input: " << shape_to_string(shapes_in[i]) << " string\n";
  }
  auto all = weights();
  auto tr = trainable_weights();
  auto ntr = non_trainable_weights();
  int64_t n_all = 0, n_tr = 0, n_ntr = 0;
  for (auto& v : all) n_all += v->value().numel();
  for (auto& v : tr) n_tr += v->value().numel();
  for (auto& v : ntr) n_ntr += v->value().numel();
  os << " Total params: " << with_commas(n_all) << " (" << human_bytes((double)bytes_of(all)) << ")\n";
  os << " Trainable params: " << with_commas(n_tr) << " (" << human_bytes((double)bytes_of(tr)) << ")\n";
  os << " Non-trainable params: " << with_commas(n_ntr) << " (" << human_bytes((double)bytes_of(ntr)) << ")\n";
  return os.str();
}

void models::Model::summary(std::ostream& os, int line_length) { os << summary_string(line_length); }

}  // namespace kiln
