#include <iostream>
int main(int argc, char** argv) { std::cerr << "kiln: not built yet\n"; return 2; }
