// Fixture of scripts/dev/check-function-length.py (tests/CMakeLists.txt): one
// function over 90 lines among shapes the checker must not take for one.
#include <vector>

namespace fixture {

struct Holder {
  int a_{0};
  std::vector<int> v_{1, 2, 3};
  Holder() : a_{1}, v_{4, 5} { a_ += 1; }
  int short_member() const { return a_; }
};

const char* kText = "a brace in a string { that never closes";

int long_one(int total) {
  auto lambda = [](int x) { return x + 1; };
  total += 0;
  total += 1;
  total += 2;
  total += 3;
  total += 4;
  total += 5;
  total += 6;
  total += 7;
  total += 8;
  total += 9;
  total += 10;
  total += 11;
  total += 12;
  total += 13;
  total += 14;
  total += 15;
  total += 16;
  total += 17;
  total += 18;
  total += 19;
  total += 20;
  total += 21;
  total += 22;
  total += 23;
  total += 24;
  total += 25;
  total += 26;
  total += 27;
  total += 28;
  total += 29;
  total += 30;
  total += 31;
  total += 32;
  total += 33;
  total += 34;
  total += 35;
  total += 36;
  total += 37;
  total += 38;
  total += 39;
  total += 40;
  total += 41;
  total += 42;
  total += 43;
  total += 44;
  total += 45;
  total += 46;
  total += 47;
  total += 48;
  total += 49;
  total += 50;
  total += 51;
  total += 52;
  total += 53;
  total += 54;
  total += 55;
  total += 56;
  total += 57;
  total += 58;
  total += 59;
  total += 60;
  total += 61;
  total += 62;
  total += 63;
  total += 64;
  total += 65;
  total += 66;
  total += 67;
  total += 68;
  total += 69;
  total += 70;
  total += 71;
  total += 72;
  total += 73;
  total += 74;
  total += 75;
  total += 76;
  total += 77;
  total += 78;
  total += 79;
  total += 80;
  total += 81;
  total += 82;
  total += 83;
  total += 84;
  total += 85;
  total += 86;
  total += 87;
  total += 88;
  total += 89;
  total += 90;
  total += 91;
  return lambda(total);
}

int short_one() {
  /* a comment with a brace { */
  return 1;
}

}  // namespace fixture
