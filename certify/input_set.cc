#include "certify/input_set.h"

#include <cmath>

#include "interval/rounding.h"

namespace lipcert {

const char* SetKindToString(SetKind k) {
  switch (k) {
    case SetKind::kBall: return "ball";
    case SetKind::kTokens: return "tokens";
    case SetKind::kBox: return "box";
  }
  return "?";
}

bool StringToSetKind(const std::string& s, SetKind* k) {
  if (s == "ball") *k = SetKind::kBall;
  else if (s == "tokens") *k = SetKind::kTokens;
  else if (s == "box") *k = SetKind::kBox;
  else return false;
  return true;
}

const char* NormKindToString(NormKind k) { return k == NormKind::kL2 ? "2" : "inf"; }

bool StringToNormKind(const std::string& s, NormKind* k) {
  if (s == "2" || s == "l2") *k = NormKind::kL2;
  else if (s == "inf" || s == "linf") *k = NormKind::kLinf;
  else return false;
  return true;
}

bool InputSet::Contains(const Eigen::MatrixXd& x, double rel_slack) const {
  if (x.rows() != center.rows() || x.cols() != center.cols()) return false;
  const Eigen::MatrixXd d = x - center;
  const double r = radius * (1 + rel_slack);
  switch (kind) {
    case SetKind::kBall: return d.norm() <= r;
    case SetKind::kTokens: return d.rowwise().norm().maxCoeff() <= r;
    case SetKind::kBox: return d.cwiseAbs().maxCoeff() <= r;
  }
  return false;
}

Eigen::MatrixXd InputSet::Project(const Eigen::MatrixXd& x) const {
  Eigen::MatrixXd d = x - center;
  switch (kind) {
    case SetKind::kBall: {
      const double n = d.norm();
      if (n > radius) d *= radius / n;
      break;
    }
    case SetKind::kTokens:
      for (int i = 0; i < d.rows(); ++i) {
        const double n = d.row(i).norm();
        if (n > radius) d.row(i) *= radius / n;
      }
      break;
    case SetKind::kBox: d = d.cwiseMax(-radius).cwiseMin(radius); break;
  }
  return center + d;
}

double InputSet::TokenRadius() const {
  switch (kind) {
    case SetKind::kBall:
    case SetKind::kTokens: return radius;
    case SetKind::kBox: return MulUp(radius, SqrtUp(double(width())));
  }
  return radius;
}

double InputSet::FrobeniusRadius() const {
  switch (kind) {
    case SetKind::kBall: return radius;
    case SetKind::kTokens: return MulUp(radius, SqrtUp(double(tokens())));
    // tokens * width is exact in a double (both < 2^26).
    case SetKind::kBox: return MulUp(radius, SqrtUp(double(tokens()) * double(width())));
  }
  return radius;
}

}  // namespace lipcert
