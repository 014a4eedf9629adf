# Loaded by llama.cpp's own project() call during `pip install llama-cpp-python` (see the
# Makefile's LLAMA_CMAKE_ARGS). llama-cpp-python forces llama.cpp's "common" library on for
# its multimodal part; we build without that part and Python never loads common, so it is
# switched off again here: a fifth of the compile.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
