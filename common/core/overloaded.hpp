#pragma once
// The visitor of std::visit made of lambdas, one per alternative.

namespace corral {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Needed by compilers without aggregate deduction (clang before 17, which builds fuzz/).
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace corral
