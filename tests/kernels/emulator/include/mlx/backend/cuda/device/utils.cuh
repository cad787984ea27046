// stand-in: gpu_emulator.h is force-included instead
