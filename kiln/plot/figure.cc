#include "kiln/plot/figure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace kiln::plot {
namespace {

// Inside a panel: room for the title, the tick labels and the axis titles.
constexpr double kLeft = 64, kRight = 16, kTop = 30, kBottom = 48, kLegend = 18;
constexpr double kFigureTitle = 34, kSubtitle = 20;
constexpr const char* kFont = "font-family=\"DejaVu Sans, Verdana, sans-serif\"";

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

int visible_columns(const Figure& fig) {
  const int n = std::max<int>(1, fig.panels.size());
  return std::max(1, std::min(fig.columns, n));
}

double header_height(const Figure& fig) {
  return (fig.title.empty() ? 8 : kFigureTitle) + (fig.subtitle.empty() ? 0 : kSubtitle);
}

bool usable(double v, Scale s) { return std::isfinite(v) && (s != Scale::kLog || v > 0); }

// The axis for the values of one coordinate of every series.
Axis fit_axis(const Panel& p, bool x_axis) {
  const Scale scale = x_axis ? p.x_scale : p.y_scale;
  if (scale == Scale::kCategory) return category_axis(p.x_categories);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Series& s : p.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], p.x_scale) || !usable(s.y[i], p.y_scale)) continue;
      const double v = x_axis ? s.x[i] : s.y[i];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (x_axis)
    for (double v : p.x_include)
      if (usable(v, scale)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  if (lo > hi) {  // nothing to show
    lo = scale == Scale::kLog ? 1 : 0;
    hi = scale == Scale::kLog ? 10 : 1;
  }
  if (!(x_axis && p.integer_x)) {
    // Ticks on the nice bounds, the domain 3% wider so no point sits on the frame.
    Axis a = scale == Scale::kLog ? log_axis(lo, hi) : linear_axis(lo, hi);
    if (scale == Scale::kLog) {
      const double pad = (std::log10(a.hi) - std::log10(a.lo)) * 0.03;
      a.lo /= std::pow(10.0, pad);
      a.hi *= std::pow(10.0, pad);
    } else {
      const double pad = (a.hi - a.lo) * 0.03;
      a.lo -= pad;
      a.hi += pad;
    }
    return a;
  }
  // Whole numbers (epochs, trial numbers): ticks on multiples of a nice
  // integer step, the domain padded so that the end points sit inside.
  Axis a;
  const double step = std::max(1.0, nice_step(hi - lo, 5));
  const double pad = hi - lo < 10 ? 0.5 : (hi - lo) * 0.04;
  a.lo = lo - pad;
  a.hi = hi + pad;
  for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9; t += step) {
    a.ticks.push_back(t);
    a.labels.push_back(format_tick(t));
  }
  return a;
}

void marker_svg(std::ostream& os, Marker m, double x, double y, const std::string& color, const std::string& label) {
  const std::string title = label.empty() ? "" : "<title>" + xml_escape(label) + "</title>";
  switch (m) {
    case Marker::kCircle:
      os << "<circle class=\"marker\" cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"3.5\" fill=\"" << color
         << "\">" << title << "</circle>\n";
      break;
    case Marker::kRing:
      os << "<circle class=\"marker\" cx=\"" << num(x) << "\" cy=\"" << num(y)
         << "\" r=\"3.5\" fill=\"white\" stroke=\"" << color << "\" stroke-width=\"1.5\">" << title << "</circle>\n";
      break;
    case Marker::kCross:
      os << "<path class=\"marker\" d=\"M" << num(x - 4) << " " << num(y - 4) << " L" << num(x + 4) << " " << num(y + 4)
         << " M" << num(x - 4) << " " << num(y + 4) << " L" << num(x + 4) << " " << num(y - 4) << "\" stroke=\""
         << color << "\" stroke-width=\"2\" fill=\"none\">" << title << "</path>\n";
      break;
    case Marker::kNone:
      break;
  }
}

void panel_svg(std::ostream& os, const Panel& p, size_t index, double ox, double oy, double w, double h) {
  const Axis ax = fit_axis(p, true), ay = fit_axis(p, false);
  std::vector<size_t> named;  // series in the legend
  for (size_t si = 0; si < p.series.size(); ++si)
    if (!p.series[si].name.empty()) named.push_back(si);
  // The legend is a row under the title, outside the data.
  const double x0 = kLeft, x1 = w - kRight, y0 = h - kBottom, y1 = kTop + (named.empty() ? 0 : kLegend);
  auto px = [&](double v) { return x0 + ax.position(v) * (x1 - x0); };
  auto py = [&](double v) { return y0 - ay.position(v) * (y0 - y1); };

  os << "<g class=\"panel\" transform=\"translate(" << num(ox) << "," << num(oy) << ")\">\n";
  os << "<text class=\"panel-title\" x=\"" << num((x0 + x1) / 2) << "\" y=\"20\" text-anchor=\"middle\" "
     << "font-size=\"14\" font-weight=\"bold\" " << kFont << ">" << xml_escape(p.title) << "</text>\n";
  os << "<rect class=\"plot-area\" x=\"" << num(x0) << "\" y=\"" << num(y1) << "\" width=\"" << num(x1 - x0)
     << "\" height=\"" << num(y0 - y1) << "\" fill=\"#fbfbfb\" stroke=\"#888\" stroke-width=\"1\"/>\n";
  for (size_t i = 0; i < ax.ticks.size(); ++i) {
    const double x = px(ax.ticks[i]);
    os << "<line class=\"grid\" x1=\"" << num(x) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x) << "\" y2=\""
       << num(y0) << "\" stroke=\"#e4e4e4\" stroke-width=\"1\"/>\n";
    os << "<text class=\"xtick\" x=\"" << num(x) << "\" y=\"" << num(y0 + 16) << "\" text-anchor=\"middle\" "
       << "font-size=\"11\" " << kFont << ">" << xml_escape(ax.labels[i]) << "</text>\n";
  }
  for (size_t i = 0; i < ay.ticks.size(); ++i) {
    const double y = py(ay.ticks[i]);
    os << "<line class=\"grid\" x1=\"" << num(x0) << "\" y1=\"" << num(y) << "\" x2=\"" << num(x1) << "\" y2=\""
       << num(y) << "\" stroke=\"#e4e4e4\" stroke-width=\"1\"/>\n";
    os << "<text class=\"ytick\" x=\"" << num(x0 - 6) << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\" "
       << "font-size=\"11\" " << kFont << ">" << xml_escape(ay.labels[i]) << "</text>\n";
  }
  if (!p.x_title.empty())
    os << "<text class=\"xlabel\" x=\"" << num((x0 + x1) / 2) << "\" y=\"" << num(h - 10)
       << "\" text-anchor=\"middle\" font-size=\"12\" " << kFont << ">" << xml_escape(p.x_title) << "</text>\n";
  if (!p.y_title.empty())
    os << "<text class=\"ylabel\" transform=\"translate(14," << num((y0 + y1) / 2)
       << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"12\" " << kFont << ">" << xml_escape(p.y_title)
       << "</text>\n";

  // Lines are clipped to the plot area (markers are inside it by construction).
  const std::string clip = "clip" + std::to_string(index);
  os << "<clipPath id=\"" << clip << "\"><rect x=\"" << num(x0) << "\" y=\"" << num(y1) << "\" width=\"" << num(x1 - x0)
     << "\" height=\"" << num(y0 - y1) << "\"/></clipPath>\n";
  for (size_t si = 0; si < p.series.size(); ++si) {
    const Series& s = p.series[si];
    const std::string& color = s.color.empty() ? palette_color(si) : s.color;
    os << "<g class=\"series\">\n";
    if (s.line != Line::kNone) {
      // One path per unbroken stretch of usable points.
      std::ostringstream d;
      bool open = false;
      double last_y = 0;
      auto flush = [&] {
        if (!d.str().empty())
          os << "<path class=\"line\" d=\"" << d.str() << "\" fill=\"none\" stroke=\"" << color
             << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << " clip-path=\"url(#" << clip
             << ")\"/>\n";
        d.str("");
        open = false;
      };
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!usable(s.x[i], p.x_scale) || !usable(s.y[i], p.y_scale)) {
          flush();
          continue;
        }
        const double x = px(s.x[i]), y = py(s.y[i]);
        if (!open) {
          d << "M" << num(x) << " " << num(y);
          open = true;
        } else if (s.line == Line::kStep) {
          d << " L" << num(x) << " " << num(last_y) << " L" << num(x) << " " << num(y);
        } else {
          d << " L" << num(x) << " " << num(y);
        }
        last_y = y;
      }
      flush();
    }
    if (s.marker != Marker::kNone)
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (usable(s.x[i], p.x_scale) && usable(s.y[i], p.y_scale))
          marker_svg(os, s.marker, px(s.x[i]), py(s.y[i]), color, i < s.point_labels.size() ? s.point_labels[i] : "");
    os << "</g>\n";
  }

  // The legend row: symbol and name per named series, centred under the title.
  if (!named.empty()) {
    auto item_width = [&](size_t si) { return 34 + 6.5 * p.series[si].name.size(); };
    double total = 0;
    for (size_t si : named) total += item_width(si);
    double lx = std::max(x0, (x0 + x1 - total) / 2);
    const double y = kTop + 10;
    os << "<g class=\"legend\">\n";
    for (size_t si : named) {
      const Series& s = p.series[si];
      const std::string& color = s.color.empty() ? palette_color(si) : s.color;
      if (s.line != Line::kNone)
        os << "<line x1=\"" << num(lx) << "\" y1=\"" << num(y - 4) << "\" x2=\"" << num(lx + 20) << "\" y2=\""
           << num(y - 4) << "\" stroke=\"" << color << "\" stroke-width=\"2\""
           << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>\n";
      if (s.marker != Marker::kNone) {
        std::ostringstream m;
        marker_svg(m, s.marker, lx + 10, y - 4, color, "");
        std::string text = m.str();  // a legend symbol, not a data point
        text.replace(text.find("class=\"marker\""), 14, "class=\"legend-marker\"");
        os << text;
      }
      os << "<text class=\"legend-label\" x=\"" << num(lx + 25) << "\" y=\"" << num(y) << "\" font-size=\"11\" "
         << kFont << ">" << xml_escape(s.name) << "</text>\n";
      lx += item_width(si);
    }
    os << "</g>\n";
  }
  os << "</g>\n";
}

}  // namespace

const std::string& palette_color(size_t i) {
  static const std::vector<std::string> colors = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colors[i % colors.size()];
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 (except tab, LF, CR).
        if ((unsigned char)c < 0x20 && c != '\t' && c != '\n' && c != '\r')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

int figure_width(const Figure& fig) { return visible_columns(fig) * fig.panel_width; }

int figure_height(const Figure& fig) {
  const int cols = visible_columns(fig);
  const int rows = std::max<int>(1, (fig.panels.size() + cols - 1) / cols);
  return (int)std::ceil(header_height(fig)) + rows * fig.panel_height;
}

std::string to_svg(const Figure& fig) {
  const int cols = visible_columns(fig);
  const int width = figure_width(fig), height = figure_height(fig);
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << width << "\" height=\"" << height
     << "\" viewBox=\"0 0 " << width << " " << height << "\">\n";
  os << "<rect width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  if (!fig.title.empty())
    os << "<text class=\"figure-title\" x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"17\" "
       << "font-weight=\"bold\" " << kFont << ">" << xml_escape(fig.title) << "</text>\n";
  if (!fig.subtitle.empty())
    os << "<text class=\"figure-subtitle\" x=\"" << width / 2 << "\" y=\"" << num(header_height(fig) - 6)
       << "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#555\" " << kFont << ">" << xml_escape(fig.subtitle)
       << "</text>\n";
  const double top = header_height(fig);
  for (size_t i = 0; i < fig.panels.size(); ++i)
    panel_svg(os, fig.panels[i], i, (double)(i % cols) * fig.panel_width, top + (double)(i / cols) * fig.panel_height,
              fig.panel_width, fig.panel_height);
  os << "</svg>\n";
  return os.str();
}

}  // namespace kiln::plot
