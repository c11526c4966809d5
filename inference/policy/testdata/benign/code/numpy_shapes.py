"""Shape bookkeeping for the patch-embedding experiment.

Run with `python numpy_shapes.py`; the expected output is pasted at the
bottom of the file so reviewers can compare without running it.
"""
import numpy as np

BATCH = 8
CHANNELS = 3
IMAGE = 224
PATCH = 16
EMBED = 768

rng = np.random.default_rng(20240305)


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """(B, C, H, W) -> (B, N, C * patch * patch)."""
    b, c, h, w = images.shape
    assert h % patch == 0 and w % patch == 0, (h, w, patch)
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    x = x.transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // patch) * (w // patch), c * patch * patch)


images = rng.standard_normal((BATCH, CHANNELS, IMAGE, IMAGE), dtype=np.float32)
patches = patchify(images, PATCH)
proj = rng.standard_normal((CHANNELS * PATCH * PATCH, EMBED), dtype=np.float32) * 0.02
tokens = patches @ proj

print("images ", images.shape, images.dtype)
print("patches", patches.shape)
print("proj   ", proj.shape)
print("tokens ", tokens.shape)
print("params ", proj.size, "bytes", proj.nbytes)

counts = np.array([[512, 64, 2048], [128, 64, 1024], [123, 45, 6789]])
print(counts)
print(counts.astype(np.float64))
print(repr(counts.astype(np.float64)))
print(np.cumsum(counts, axis=1))

grid = np.arange(12).reshape(3, 4)
print(repr(grid))
print(grid.strides, grid.itemsize)

# Expected output:
# images  (8, 3, 224, 224) float32
# patches (8, 196, 768)
# proj    (768, 768)
# tokens  (8, 196, 768)
# params  589824 bytes 2359296
# [[ 512   64 2048]
#  [ 128   64 1024]
#  [ 123   45 6789]]
# [[ 512.   64. 2048.]
#  [ 128.   64. 1024.]
#  [ 123.   45. 6789.]]
# array([[ 512.,   64., 2048.],
#        [ 128.,   64., 1024.],
#        [ 123.,   45., 6789.]])
# [[ 512  576 2624]
#  [ 128  192 1216]
#  [ 123  168 6957]]
# array([[ 0,  1,  2,  3],
#        [ 4,  5,  6,  7],
#        [ 8,  9, 10, 11]])
# (32, 8) 8
