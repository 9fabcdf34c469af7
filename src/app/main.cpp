// partrain: the command-line program (train, plan, inspect).
#include <cstdio>

int main() {
  std::puts("partrain");
  return 0;
}
