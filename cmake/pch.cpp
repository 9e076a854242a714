// Translation unit that carries the precompiled libtorch header.
