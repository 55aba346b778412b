// lipcert command-line interface (placeholder until the subcommands land).
#include <cstdio>
int main() { std::puts("lipcert"); return 0; }
