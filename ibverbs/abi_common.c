/* The device-independent calls of the libibverbs ABI (verbsabi/). */
#include "../verbsabi/common.c"
