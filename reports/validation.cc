// The validation section: published results recomputed with lipcert's own engines.
#include "reports/validation.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <stdexcept>

#include "certify/certify.h"
#include "certify/closed_form.h"
#include "certify/witness_eval.h"
#include "models/forward.h"
#include "reports/svg_plot.h"

namespace lipcert::reports {
namespace {

Certificate CertifyOn(const AttentionLayer& layer, SetKind kind, const Eigen::MatrixXd& centre, double radius,
                      NormKind norm, const ValidationOptions& o, const std::string& what) {
  InputSet set;
  set.kind = kind;
  set.center = centre;
  set.radius = radius;
  CertifyOptions co;
  co.norm = norm;
  co.time_limit_s = o.time_limit_s;
  co.threads = o.threads;
  Provenance p;
  p.model_path = "validation/" + what;
  p.model_sha256 = "(layer built in code)";
  p.preset = "native";
  p.centre_source = what;
  const auto t0 = std::chrono::steady_clock::now();
  Certificate c = Certify(layer, set, co, p);
  if (std::getenv("LIPCERT_VALIDATION_TIMING"))
    std::fprintf(stderr, "validation: %s N=%d r=%g: %.2f s\n", what.c_str(), int(centre.rows()), radius,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return c;
}

// A witness compared with a certificate on a set must certainly lie in that set.
void RequireInSet(SetKind kind, const Eigen::MatrixXd& centre, double radius, const Eigen::MatrixXd& x) {
  InputSet set;
  set.kind = kind;
  set.center = centre;
  set.radius = radius;
  if (!CertainlyInSet(set, x)) throw std::logic_error("validation: a construction is not certainly in its set");
}

double Engine(const Certificate& c, EngineId id) {
  for (const EngineResult& e : c.engines)
    if (e.id == id && e.applied) return e.upper.value();
  return INFINITY;
}

// Kim et al.'s figures at N = 2, 10, 100, 1000 (D = H = 1, unit weights): the bound and
// their numerical ascent.
void PublishedKim(int n, double* bound, double* ascent) {
  *bound = *ascent = 0;
  const int ns[] = {2, 10, 100, 1000};
  const double b[] = {2.11, 5.40, 11.52, 18.68}, a[] = {1.60, 4.41, 10.07, 16.92};
  for (int i = 0; i < 4; ++i)
    if (ns[i] == n) *bound = b[i], *ascent = a[i];
}

// x_1 = 0, `plus` tokens at +c and the rest at -c.
Eigen::MatrixXd ZeroAndPlusMinus(int tokens, int plus, double c) {
  Eigen::MatrixXd x(tokens, 1);
  x(0, 0) = 0;
  for (int i = 1; i < tokens; ++i) x(i, 0) = i <= plus ? c : -c;
  return x;
}

}  // namespace

AttentionLayer UnitLayer(AttentionKind kind) {
  AttentionLayer L;
  L.kind = kind;
  L.d_model = L.heads = L.head_dim_qk = L.head_dim_v = 1;
  L.wq = L.wk = L.wv = L.wo = Eigen::MatrixXd::Ones(1, 1);
  return L;
}

double LambertW0(double x) {
  if (x <= 0) return 0;
  double w = x < 1 ? x : std::log(x);
  for (int i = 0; i < 200; ++i) {
    const double ew = std::exp(w), step = (w * ew - x) / (ew * (w + 1));
    w -= step;
    if (std::fabs(step) <= 1e-17 * std::fabs(w)) break;
  }
  return w;
}

Eigen::MatrixXd KimTightnessInput(int tokens) {
  const double w = LambertW0((tokens - 1) / std::exp(1.0));
  return ZeroAndPlusMinus(tokens, tokens / 2, std::sqrt(1 + w));  // (N-1)/2 each side for odd N
}

double KimTightnessFormula(int tokens) {
  const double w = LambertW0((tokens - 1) / std::exp(1.0)), y = 1 + w;
  return 4 * w + (2 - y) / y;
}

Eigen::MatrixXd VarianceInput(int tokens, double radius) { return ZeroAndPlusMinus(tokens, tokens / 2, radius); }

double VarianceFormula(int tokens, double radius) {
  const Eigen::MatrixXd x = VarianceInput(tokens, radius);
  const double mean = x.mean(), var = (x.array() - mean).square().mean();
  return 1.0 / tokens + var;
}

Eigen::MatrixXd UnbalancedInput(int heavy, int light, double radius) {
  Eigen::MatrixXd x(heavy + light, 1);
  for (int i = 0; i < heavy + light; ++i) x(i, 0) = i < heavy ? radius : radius / 2;
  return x;
}

double CastinMassFormula(int tokens) {
  const double m = tokens - 1;
  return std::sqrt(m) / 2 * (1 + std::log(m) / 2);
}

LowerBound BestDirectionWitness(const AttentionLayer& layer, const Eigen::MatrixXd& x, NormKind norm) {
  const int n = int(x.rows()), d = int(x.cols());
  Eigen::MatrixXd v(n, d);
  if (norm == NormKind::kL2) {
    const Eigen::MatrixXd jac = DenseJacobian<double>(layer, x);
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(jac, Eigen::ComputeFullV);
    for (int c = 0; c < n * d; ++c) v(c / d, c % d) = svd.matrixV()(c, 0);
  } else {
    // ||J||_inf is the largest absolute row sum: the direction is that row's sign pattern.
    // Rows by vector-Jacobian products; wide inputs check the first token's rows only.
    const LayerState<double> s = Evaluate(layer, Eigen::MatrixXd(x));
    const int rows = n * d <= 256 ? n * d : d;
    double best = -1;
    for (int r = 0; r < rows; ++r) {
      Eigen::MatrixXd u = Eigen::MatrixXd::Zero(n, d);
      u(r / d, r % d) = 1;
      const Eigen::MatrixXd row = Vjp(layer, s, u);
      if (row.cwiseAbs().sum() > best) {
        best = row.cwiseAbs().sum();
        v = row.unaryExpr([](double a) { return a >= 0 ? 1.0 : -1.0; });
      }
    }
  }
  return WitnessLowerBound(layer, x, v, norm);
}

ValidationResult RunValidation(const ValidationOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  ValidationResult res;
  const AttentionLayer dot = UnitLayer(AttentionKind::kDot), l2 = UnitLayer(AttentionKind::kL2);
  // Kim et al.: DP grows without bound in R, L2 stays below a radius-free bound.
  const int n = o.growth_tokens;
  res.growth_tokens = n;
  const Eigen::MatrixXd zero = Eigen::MatrixXd::Zero(n, 1);
  for (double r : o.growth_radii) {
    GrowthRow g;
    g.radius = r;
    const Certificate cd = CertifyOn(dot, SetKind::kTokens, zero, r, NormKind::kL2, o, "unit dot layer, tokens set around 0");
    g.dot_upper = cd.upper_bound.value();
    g.dot_lower = cd.lower_bound.value();
    g.castin = Engine(cd, EngineId::kClosedFormCastin);
    g.variance_formula = VarianceFormula(n, r * kInside);
    Eigen::MatrixXd e1 = Eigen::MatrixXd::Zero(n, 1);
    e1(0, 0) = 1;
    const Eigen::MatrixXd xv = VarianceInput(n, r * kInside);
    RequireInSet(SetKind::kTokens, zero, r, xv);
    g.variance_witness = WitnessLowerBound(dot, xv, e1, NormKind::kL2);
    const Certificate cl = CertifyOn(l2, SetKind::kTokens, zero, r, NormKind::kL2, o, "unit L2 layer, tokens set around 0");
    g.l2_upper = cl.upper_bound.value();
    g.l2_lower = cl.lower_bound.value();
    g.kim = Engine(cl, EngineId::kClosedFormKim);
    res.growth.push_back(g);
  }
  // Kim et al.: the bound against N, and the tightness construction (odd N), norm inf.
  for (int tokens : o.kim_tokens) {
    KimRow k;
    k.tokens = tokens;
    k.w = LambertW0((tokens - 1) / std::exp(1.0));
    k.kim_inf_bound = 4 * k.w + 1;
    PublishedKim(tokens, &k.published_bound, &k.published_ascent);
    const bool odd = tokens % 2 == 1;
    const Eigen::MatrixXd x = odd ? KimTightnessInput(tokens) : ZeroAndPlusMinus(tokens, tokens / 2, std::sqrt(1 + k.w));
    k.construction_formula = odd ? KimTightnessFormula(tokens) : 0;
    k.construction_witness = BestDirectionWitness(l2, x, NormKind::kLinf);
    if (tokens <= o.kim_certify_max_tokens)
      k.certified_upper =
          CertifyOn(l2, SetKind::kBox, x, 0, NormKind::kLinf, o, "unit L2 layer, Kim's construction").upper_bound.value();
    InputSet at_x;
    at_x.kind = SetKind::kBox;
    at_x.center = x;
    for (const ClosedFormBound& b : ClosedFormBounds(l2, at_x, NormKind::kL2))
      if (b.name == "closed_form/kim") k.kim_l2_bound = b.upper.value();
    res.kim.push_back(k);
  }
  // Castin et al.: unbalanced mass, and mass splitting at twice the tokens.
  for (int light : o.castin_light_tokens) {
    CastinRow c;
    c.tokens = light + 1;
    c.radius = 2 * std::sqrt(std::log(double(light)));
    c.formula = CastinMassFormula(c.tokens);
    const Eigen::MatrixXd x = UnbalancedInput(1, light, c.radius * kInside);
    RequireInSet(SetKind::kTokens, Eigen::MatrixXd::Zero(c.tokens, 1), c.radius, x);
    Eigen::MatrixXd e1 = Eigen::MatrixXd::Zero(c.tokens, 1);
    e1(0, 0) = 1;
    c.moving_witness = WitnessLowerBound(dot, x, e1, NormKind::kL2);
    c.best_witness = BestDirectionWitness(dot, x, NormKind::kL2);
    const Certificate cert = CertifyOn(dot, SetKind::kTokens, Eigen::MatrixXd::Zero(c.tokens, 1), c.radius,
                                       NormKind::kL2, o, "unit dot layer, B_R^N");
    c.certified_upper = cert.upper_bound.value();
    c.castin = Engine(cert, EngineId::kClosedFormCastin);
    c.split_tokens = 2 * c.tokens;
    const Eigen::MatrixXd one = UnbalancedInput(1, c.split_tokens - 1, c.radius * kInside);
    const Eigen::MatrixXd two = UnbalancedInput(2, c.split_tokens - 2, c.radius * kInside);
    RequireInSet(SetKind::kTokens, Eigen::MatrixXd::Zero(c.split_tokens, 1), c.radius, one);
    RequireInSet(SetKind::kTokens, Eigen::MatrixXd::Zero(c.split_tokens, 1), c.radius, two);
    c.one_heavy_witness = BestDirectionWitness(dot, one, NormKind::kL2);
    c.split_witness = BestDirectionWitness(dot, two, NormKind::kL2);
    const Certificate split = CertifyOn(dot, SetKind::kTokens, Eigen::MatrixXd::Zero(c.split_tokens, 1), c.radius,
                                        NormKind::kL2, o, "unit dot layer, B_R^N");
    c.split_certified_upper = split.upper_bound.value();
    res.castin.push_back(c);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

namespace {

std::string N6(double v) { return FormatNumber(v, 6); }
std::string OrDash(double v) { return v > 0 ? N6(v) : "—"; }

Series Line(const std::string& label, const std::string& id, int color, LineStyle style) {
  return Series{label, id, {}, {}, PaletteColor(color), style, true};
}

}  // namespace

std::vector<Section> ValidationSections(const ValidationResult& r) {
  const int kCertifyMaxShown = ValidationOptions{}.kim_certify_max_tokens;
  std::vector<Section> out;
  const std::string intro = "Recomputed on the spot (" + N6(r.seconds) +
                            " s) with lipcert's own engines on layers built in code: D = H = 1, all weights 1. "
                            "Certified numbers are proven upper bounds; witnessed numbers are rigorous lower bounds "
                            "at explicit inputs.";
  {
    Section s;
    s.title = "Validation: Kim et al. — dot-product attention is not globally Lipschitz, L2 attention is";
    s.blocks.push_back(Paragraph{intro});
    s.blocks.push_back(Paragraph{"Tokens sets ||x_i|| <= R around 0 with N = " + std::to_string(r.growth_tokens) +
                                 ". Kim et al.: with x_1 = 0 the first row of P is uniform and J_11 = 1/N + Var(x), so "
                                 "the dot layer's constant grows without bound in R; the L2 layer's is below Kim's "
                                 "bound, which does not depend on R. Castin et al.'s closed form grows like R^2."});
    LinePlot lp;
    lp.title = "Dot-product vs L2 attention on B_R^N (N = " + std::to_string(r.growth_tokens) + ")";
    lp.x_label = "radius R";
    lp.y_label = "local Lipschitz constant";
    Series du = Line("dot: certified upper", "upper", 1, LineStyle::kSolid);
    Series dl = Line("dot: witnessed lower (search)", "lower", 1, LineStyle::kDashed);
    Series dv = Line("dot: witness x_1 = 0, x_j = ±R", "witness", 4, LineStyle::kDashed);
    Series df = Line("Kim et al.: 1/N + Var(x)", "formula", 4, LineStyle::kDotted);
    Series dc = Line("closed_form/castin", "closed_form/castin", 3, LineStyle::kDotted);
    Series lu = Line("L2: certified upper", "upper", 0, LineStyle::kSolid);
    Series ll = Line("L2: witnessed lower", "lower", 0, LineStyle::kDashed);
    Series lk = Line("closed_form/kim (radius-free)", "closed_form/kim", 2, LineStyle::kDotted);
    Band db{"dot: certified band", {}, {}, {}, PaletteColor(1)}, lb{"L2: certified band", {}, {}, {}, PaletteColor(0)};
    Table t;
    t.caption = "Dot and L2 layers against R";
    t.header = {"R", "dot certified", "dot witnessed", "witness at x_1 = 0, ±R", "1/N + Var (Kim)", "castin",
                "castin / R^2", "log(witness) / R^2", "L2 certified", "L2 witnessed", "kim (radius-free)"};
    for (const GrowthRow& g : r.growth) {
      for (Series* s2 : {&du, &dl, &dv, &df, &dc, &lu, &ll, &lk}) s2->x.push_back(g.radius);
      du.y.push_back(g.dot_upper), dl.y.push_back(g.dot_lower), dv.y.push_back(g.variance_witness.value());
      df.y.push_back(g.variance_formula), dc.y.push_back(g.castin), lu.y.push_back(g.l2_upper);
      ll.y.push_back(g.l2_lower), lk.y.push_back(g.kim);
      db.x.push_back(g.radius), db.lo.push_back(g.dot_lower), db.hi.push_back(g.dot_upper);
      lb.x.push_back(g.radius), lb.lo.push_back(g.l2_lower), lb.hi.push_back(g.l2_upper);
      const double best_dot = std::max(g.dot_lower, g.variance_witness.value());
      t.rows.push_back({N6(g.radius), N6(g.dot_upper), N6(g.dot_lower), N6(g.variance_witness.value()),
                        N6(g.variance_formula), N6(g.castin), N6(g.castin / (g.radius * g.radius)),
                        N6(std::log(best_dot) / (g.radius * g.radius)), N6(g.l2_upper), N6(g.l2_lower), N6(g.kim)});
    }
    lp.bands = {db, lb};
    lp.series = {du, dl, dv, df, dc, lu, ll, lk};
    s.blocks.push_back(Figure{"validation-kim-growth", RenderLinePlot(lp),
                              "Red: the dot layer, unbounded in R; blue: the L2 layer, below Kim's radius-free bound "
                              "(green, dotted)."});
    s.blocks.push_back(t);
    out.push_back(s);
  }
  {
    Section s;
    s.title = "Validation: Kim et al. — the L2 bound against N and its tightness";
    s.blocks.push_back(Paragraph{
        "Norm inf, D = H = 1, unit weights: Kim et al.'s bound is 4 W0((N-1)/e) + 1 (published: 2.11, 5.40, 11.52, "
        "18.68 at N = 2, 10, 100, 1000, with numerical ascent reaching 1.60, 4.41, 10.07, 16.92). For odd N the input "
        "x_1 = 0 with (N-1)/2 tokens at ±sqrt(1 + w), w = W0((N-1)/e), attains 4 w + (2 - y)/y, y = 1 + w, in the "
        "first row of J; lipcert evaluates that row rigorously (witness) and certifies ||J||_inf at that input "
        "(a box of radius 0; up to N = " + std::to_string(kCertifyMaxShown) + "). For even N the same input with one more "
        "token at +sqrt(1 + w)."});
    LinePlot lp;
    lp.title = "Kim et al.'s L2 bound and its tightness against N (norm inf)";
    lp.x_label = "tokens N";
    lp.y_label = "||J||_inf";
    Series kb = Line("Kim bound 4 W0((N-1)/e) + 1 (lipcert)", "closed_form/kim_inf", 2, LineStyle::kDotted);
    Series pb = Line("Kim et al., published bound", "published_bound", 3, LineStyle::kDotted);
    Series pa = Line("Kim et al., published ascent", "published_ascent", 4, LineStyle::kDashed);
    Series cf = Line("construction 4w + (2-y)/y", "formula", 5, LineStyle::kDotted);
    Series cw = Line("lipcert: witness at the construction", "witness", 1, LineStyle::kDashed);
    Series cu = Line("lipcert: certified at the construction", "upper", 0, LineStyle::kSolid);
    Table t;
    t.caption = "Kim et al.'s bound and construction against N";
    t.header = {"N", "W0((N-1)/e)", "bound 4w+1", "published bound", "published ascent", "4w + (2-y)/y",
                "lipcert witness", "lipcert certified", "closed_form/kim (norm 2)"};
    for (const KimRow& k : r.kim) {
      const double x = k.tokens;
      kb.x.push_back(x), kb.y.push_back(k.kim_inf_bound);
      if (k.published_bound > 0) pb.x.push_back(x), pb.y.push_back(k.published_bound);
      if (k.published_ascent > 0) pa.x.push_back(x), pa.y.push_back(k.published_ascent);
      if (k.construction_formula > 0) cf.x.push_back(x), cf.y.push_back(k.construction_formula);
      cw.x.push_back(x), cw.y.push_back(k.construction_witness.value());
      if (k.certified_upper > 0) cu.x.push_back(x), cu.y.push_back(k.certified_upper);
      t.rows.push_back({std::to_string(k.tokens), N6(k.w), N6(k.kim_inf_bound), OrDash(k.published_bound),
                        OrDash(k.published_ascent), OrDash(k.construction_formula), N6(k.construction_witness.value()),
                        k.certified_upper > 0 ? N6(k.certified_upper) : "not run (N > " + std::to_string(kCertifyMaxShown) + ")", N6(k.kim_l2_bound)});
    }
    lp.series = {kb, pb, pa, cf, cw, cu};
    s.blocks.push_back(Figure{"validation-kim-tightness", RenderLinePlot(lp),
                              "The witness meets the construction's formula; bound and construction differ by "
                              "2 - 2/y, a vanishing fraction of the bound as N grows."});
    s.blocks.push_back(t);
    out.push_back(s);
  }
  {
    Section s;
    s.title = "Validation: Castin et al. — unbalanced mass and mass splitting on B_R^N";
    s.blocks.push_back(Paragraph{
        "Dot layer, D = H = 1, unit weights, tokens sets ||x_i|| <= R around 0. With x_1 = R and x_2..x_N = R/2 and "
        "N - 1 = exp(R^2/4), every other query puts half its attention on x_1 and ||J e_1|| >= (sqrt(N-1)/2)(1 + "
        "log(N-1)/2) (Castin et al.). lipcert evaluates J e_1 there rigorously (moving x_1) and along the top singular "
        "direction. Mass splitting, at twice the tokens and the same R: every token duplicated (two heavy, 2(N-1) "
        "light: the same attention weights, so the witness equals the N-token one exactly) against one heavy token "
        "among 2N - 1 light ones (less than half the attention on it, yet a larger witness here). Castin et al.'s "
        "point, that duplicating a token before perturbing it can beat moving tokens, concerns sets that allow "
        "duplication; on a fixed B_R^N lipcert's certified bound holds for both."});
    LinePlot lp;
    lp.title = "Castin et al.'s unbalanced-mass lower bound against N";
    lp.x_label = "tokens N (R = 2 sqrt(log(N-1)))";
    lp.y_label = "||J||_2";
    Series f = Line("Castin et al.: (sqrt(N-1)/2)(1 + log(N-1)/2)", "formula", 4, LineStyle::kDotted);
    Series mw = Line("lipcert: witness moving x_1", "witness", 1, LineStyle::kDashed);
    Series bw = Line("lipcert: witness, best direction", "lower", 3, LineStyle::kDashed);
    Series cu = Line("lipcert: certified on B_R^N", "upper", 0, LineStyle::kSolid);
    Series cc = Line("closed_form/castin", "closed_form/castin", 2, LineStyle::kDotted);
    Table t;
    t.caption = "Unbalanced mass (N tokens) and mass splitting (2N tokens, same R)";
    t.header = {"N", "R", "formula", "witness moving x_1", "witness best direction", "certified B_R^N", "castin",
                "2N", "2N: one heavy token", "2N: heavy token duplicated", "2N: certified"};
    for (const CastinRow& c : r.castin) {
      const double x = c.tokens;
      for (Series* s2 : {&f, &mw, &bw, &cu, &cc}) s2->x.push_back(x);
      f.y.push_back(c.formula), mw.y.push_back(c.moving_witness.value()), bw.y.push_back(c.best_witness.value());
      cu.y.push_back(c.certified_upper), cc.y.push_back(c.castin);
      t.rows.push_back({std::to_string(c.tokens), N6(c.radius), N6(c.formula), N6(c.moving_witness.value()),
                        N6(c.best_witness.value()), N6(c.certified_upper), N6(c.castin), std::to_string(c.split_tokens),
                        N6(c.one_heavy_witness.value()), N6(c.split_witness.value()), N6(c.split_certified_upper)});
    }
    lp.series = {f, mw, bw, cu, cc};
    s.blocks.push_back(Figure{"validation-castin-mass", RenderLinePlot(lp),
                              "Every witness lies in B_R^N, so it sits below lipcert's certified bound on that set."});
    s.blocks.push_back(t);
    out.push_back(s);
  }
  return out;
}

}  // namespace lipcert::reports
