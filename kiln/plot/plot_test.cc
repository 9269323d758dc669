// kiln/plot: tick values, the SVG parsed back (well-formed, the right
// panels, points, lines and escaped names), PNG rendering and history
// figures.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/plot/axis.h"
#include "kiln/plot/figure.h"
#include "kiln/plot/history_plot.h"
#include "kiln/plot/render.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"
#include "kiln/testing/xml.h"

namespace kiln::plot {
namespace {

std::vector<std::string> texts(const std::vector<const XmlElement*>& els) {
  std::vector<std::string> out;
  for (auto* e : els) out.push_back(e->text);
  return out;
}

TEST(Axis, LinearTicksAreNiceAndCoverTheData) {
  Axis a = linear_axis(0.13, 0.87);
  EXPECT_DOUBLE_EQ(a.lo, 0);
  EXPECT_DOUBLE_EQ(a.hi, 1);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"}));
  EXPECT_EQ(linear_axis(0, 100).labels, (std::vector<std::string>{"0", "20", "40", "60", "80", "100"}));
  EXPECT_EQ(linear_axis(-1.2, 0.3).labels, (std::vector<std::string>{"-1.5", "-1", "-0.5", "0", "0.5"}));
  // One value: a range around it, never an empty domain.
  Axis one = linear_axis(5, 5);
  EXPECT_LT(one.lo, 5);
  EXPECT_GT(one.hi, 5);
  EXPECT_DOUBLE_EQ(one.position(one.lo), 0);
  EXPECT_DOUBLE_EQ(one.position(one.hi), 1);
  EXPECT_EQ(format_tick(0.1 + 0.2), "0.3");
  EXPECT_EQ(format_tick(-0.0), "0");
  EXPECT_EQ(format_tick(1e-5), "1e-05");
  EXPECT_DOUBLE_EQ(nice_step(7.3, 5), 2);
  EXPECT_DOUBLE_EQ(nice_step(0.0042, 5), 0.001);
}

TEST(Axis, LogTicksArePowersOfTenWidenedToWholeDecades) {
  Axis wide = log_axis(2e-4, 3e-2);
  EXPECT_DOUBLE_EQ(wide.lo, 1e-4);
  EXPECT_DOUBLE_EQ(wide.hi, 0.1);
  EXPECT_EQ(wide.labels, (std::vector<std::string>{"0.0001", "0.001", "0.01", "0.1"}));
  EXPECT_DOUBLE_EQ(wide.position(1e-3), 1.0 / 3);
  // Under three decades: 2 and 5 times each power too.
  EXPECT_EQ(log_axis(0.002, 0.05).labels,
            (std::vector<std::string>{"0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1"}));
  EXPECT_EQ(log_axis(10, 10).labels, (std::vector<std::string>{"10", "20", "50", "100"}));
  expect_error<ValueError>([] { log_axis(0, 1); }, {"positive"});
  Axis c = category_axis({"relu", "tanh"});
  EXPECT_EQ(c.labels, (std::vector<std::string>{"relu", "tanh"}));
  EXPECT_DOUBLE_EQ(c.position(0), 0.25);
}

Figure two_panels() {
  Figure fig;
  fig.title = "runs of a<b&c";
  Panel& a = fig.panels.emplace_back();
  a.title = "loss \"x\" & 'y'";
  a.x_title = "epoch";
  a.integer_x = true;
  a.series.push_back({.name = "a<b&c", .x = {1, 2, 3, 4}, .y = {1.0, 0.5, 0.25, 0.2}, .marker = Marker::kCircle});
  // A NaN breaks the line: two stretches, three markers.
  a.series.push_back(
      {.name = "validation", .x = {1, 2, 3, 4}, .y = {1.1, NAN, 0.4, 0.3}, .marker = Marker::kCross, .dashed = true});
  Panel& b = fig.panels.emplace_back();
  b.title = "learning_rate";
  b.x_scale = Scale::kLog;
  b.series.push_back(
      {.x = {1e-4, 3e-3, 0.05, -1}, .y = {0.8, 0.9, 0.7, 0.1}, .line = Line::kNone, .marker = Marker::kRing});
  Panel& c = fig.panels.emplace_back();
  c.title = "activation";
  c.x_scale = Scale::kCategory;
  c.x_categories = {"relu", "tanh", "x<y"};
  c.series.push_back({.x = {0, 2}, .y = {0.5, 0.6}, .line = Line::kNone, .marker = Marker::kCircle});
  return fig;
}

TEST(Figure, SvgParsesBackWithPanelsPointsLinesAndEscapedNames) {
  const Figure fig = two_panels();
  const std::string svg = to_svg(fig);
  auto root = parse_xml(svg);
  ASSERT_EQ(root->name, "svg");
  EXPECT_EQ(root->attr("width"), std::to_string(figure_width(fig)));
  EXPECT_EQ(root->attr("height"), std::to_string(figure_height(fig)));
  EXPECT_EQ(figure_width(fig), 3 * fig.panel_width);
  EXPECT_EQ(texts(root->find_all("text", "figure-title")), std::vector<std::string>{"runs of a<b&c"});
  EXPECT_EQ(svg.find("a<b&c"), std::string::npos) << "unescaped name in the SVG";

  auto panels = root->find_all("g", "panel");
  ASSERT_EQ(panels.size(), 3u);
  EXPECT_EQ(texts(panels[0]->find_all("text", "panel-title")), std::vector<std::string>{"loss \"x\" & 'y'"});
  auto series = panels[0]->find_all("g", "series");
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[0]->find_all("path", "line").size(), 1u);
  EXPECT_EQ(series[0]->find_all("circle", "marker").size(), 4u);
  EXPECT_EQ(series[1]->find_all("path", "line").size(), 2u);  // broken at the NaN
  EXPECT_EQ(series[1]->find_all("path", "marker").size(), 3u);
  EXPECT_EQ(series[1]->find_all("path", "line")[0]->attr("stroke-dasharray"), "6,4");
  EXPECT_EQ(texts(panels[0]->find_all("text", "legend-label")), (std::vector<std::string>{"a<b&c", "validation"}));
  EXPECT_EQ(texts(panels[0]->find_all("text", "xtick")), (std::vector<std::string>{"1", "2", "3", "4"}));
  EXPECT_EQ(texts(panels[0]->find_all("text", "xlabel")), std::vector<std::string>{"epoch"});
  EXPECT_EQ(texts(panels[0]->find_all("text", "ytick")).front(), "0.2");

  // The log panel: decade ticks; the point at x = -1 cannot be placed and is left out.
  EXPECT_EQ(texts(panels[1]->find_all("text", "xtick")), (std::vector<std::string>{"0.0001", "0.001", "0.01", "0.1"}));
  EXPECT_EQ(panels[1]->find_all("circle", "marker").size(), 3u);
  EXPECT_TRUE(panels[1]->find_all("path", "line").empty());
  EXPECT_TRUE(panels[1]->find_all("g", "legend").empty());  // no named series
  // Categories label their ticks by name.
  EXPECT_EQ(texts(panels[2]->find_all("text", "xtick")), (std::vector<std::string>{"relu", "tanh", "x<y"}));
  EXPECT_EQ(panels[2]->find_all("circle", "marker").size(), 2u);

  // Every marker lies inside its panel's plot area.
  for (auto* p : panels) {
    auto area = p->find_all("rect", "plot-area");
    ASSERT_EQ(area.size(), 1u);
    const double x = std::stod(area[0]->attr("x")), y = std::stod(area[0]->attr("y"));
    const double w = std::stod(area[0]->attr("width")), h = std::stod(area[0]->attr("height"));
    for (auto* m : p->find_all("circle", "marker")) {
      EXPECT_GE(std::stod(m->attr("cx")), x);
      EXPECT_LE(std::stod(m->attr("cx")), x + w);
      EXPECT_GE(std::stod(m->attr("cy")), y);
      EXPECT_LE(std::stod(m->attr("cy")), y + h);
    }
  }
}

TEST(Figure, XIncludeWidensTheAxisBeyondTheData) {
  Figure fig;
  Panel& p = fig.panels.emplace_back();
  p.x_include = {0, 10};  // e.g. a search space's bounds
  p.series.push_back({.x = {2, 3}, .y = {1, 2}, .line = Line::kNone, .marker = Marker::kCircle});
  auto root = parse_xml(to_svg(fig));
  EXPECT_EQ(texts(root->find_all("text", "xtick")), (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
}

TEST(Figure, XmlEscapeCoversTheFiveEntitiesAndDropsControlCharacters) {
  EXPECT_EQ(xml_escape("a<b&c>\"d'\x01"), "a&lt;b&amp;c&gt;&quot;d&apos; ");
  // The test reader itself refuses what is not well-formed.
  EXPECT_THROW(parse_xml("<svg><g></svg>"), std::runtime_error);
  EXPECT_THROW(parse_xml("<svg>a<b</svg>"), std::runtime_error);
  EXPECT_THROW(parse_xml("<svg>a&b</svg>"), std::runtime_error);
  EXPECT_THROW(parse_xml("<svg x=1/>"), std::runtime_error);
}

uint32_t big_endian(const std::string& s, size_t at) {
  return (uint32_t)(uint8_t)s[at] << 24 | (uint32_t)(uint8_t)s[at + 1] << 16 | (uint32_t)(uint8_t)s[at + 2] << 8 |
         (uint32_t)(uint8_t)s[at + 3];
}

TEST(Render, PngHasTheSignatureAndTheFiguresSize) {
  if (!png_supported()) GTEST_SKIP() << "built without librsvg (apt-get install librsvg2-dev): PNG not tested";
  TempDir dir;
  const Figure fig = two_panels();
  const std::string path = dir.path() + "/fig.PNG";
  write_figure(fig, path);
  const std::string png = read_file(path);
  ASSERT_GT(png.size(), 33u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(big_endian(png, 16), (uint32_t)figure_width(fig));
  EXPECT_EQ(big_endian(png, 20), (uint32_t)figure_height(fig));
  EXPECT_GT(png.size(), 5000u) << "an almost empty image: nothing drawn?";
  expect_error<FormatError>([] { svg_to_png("<svg"); }, {"PNG"});
}

TEST(Render, TheExtensionPicksTheFormatAndAnythingElseIsOneClearError) {
  TempDir dir;
  write_figure(two_panels(), dir.path() + "/fig.svg");
  EXPECT_NO_THROW(parse_xml(read_file(dir.path() + "/fig.svg")));
  EXPECT_EQ(plot_format("a/b.Svg"), "svg");
  for (const std::string bad : {"plot.pdf", "plot", "dir.svg/plot", "plot.svg.txt"})
    expect_error<ValueError>([&] { write_figure(two_panels(), dir.path() + "/" + bad); }, {".svg or .png", bad});
  EXPECT_FALSE(path_exists(dir.path() + "/plot.pdf"));
}

TEST(HistoryFigure, OnePanelPerMetricWithTrainAndValidationCurves) {
  std::map<std::string, std::vector<double>> h = {{"accuracy", {0.5, 0.7, 0.8}},
                                                  {"loss", {1.0, 0.6, 0.4}},
                                                  {"val_accuracy", {0.45, 0.65, 0.7}},
                                                  {"val_loss", {1.1, 0.8, 0.7}},
                                                  {"val_auc", {0.6, 0.7, 0.75}}};
  Figure fig = history_figure(h, {0, 1, 2}, "mlp");
  ASSERT_EQ(fig.panels.size(), 3u);
  EXPECT_EQ(fig.panels[0].title, "loss");  // loss first, then by name
  EXPECT_EQ(fig.panels[1].title, "accuracy");
  EXPECT_EQ(fig.panels[2].title, "val_auc");  // no "auc": a panel of its own
  ASSERT_EQ(fig.panels[0].series.size(), 2u);
  EXPECT_EQ(fig.panels[0].series[0].name, "train");
  EXPECT_EQ(fig.panels[0].series[1].name, "validation");
  EXPECT_EQ(fig.panels[0].series[1].x, (std::vector<double>{1, 2, 3}));  // epochs from 1
  EXPECT_EQ(fig.panels[2].series.size(), 1u);

  auto root = parse_xml(to_svg(fig));
  auto panels = root->find_all("g", "panel");
  ASSERT_EQ(panels.size(), 3u);
  EXPECT_EQ(panels[1]->find_all("path", "line").size(), 2u);
  EXPECT_EQ(panels[1]->find_all("circle", "marker").size(), 6u);
  EXPECT_EQ(texts(panels[0]->find_all("text", "xtick")), (std::vector<std::string>{"1", "2", "3"}));

  // One epoch: a point per curve, an axis around it.
  Figure one = history_figure({{"loss", {0.7}}, {"val_loss", {0.8}}}, {0}, "one");
  auto r1 = parse_xml(to_svg(one));
  EXPECT_EQ(r1->find_all("circle", "marker").size(), 2u);
  EXPECT_EQ(texts(r1->find_all("text", "xtick")), std::vector<std::string>{"1"});
  // validation_freq = 2: validation points after epochs 2 and 4.
  Figure freq = history_figure({{"loss", {4, 3, 2, 1}}, {"val_loss", {3.5, 1.5}}}, {0, 1, 2, 3}, "freq");
  EXPECT_EQ(freq.panels[0].series[1].x, (std::vector<double>{2, 4}));
}

}  // namespace
}  // namespace kiln::plot
