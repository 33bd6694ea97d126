"""A quasicrystal pattern: the sum of plane waves at evenly spaced angles over a grid."""
import numpy as np

size, waves, phase = 64, 7, 0.4  # size
x = np.linspace(-np.pi * 8, np.pi * 8, size)
X, Y = np.meshgrid(x, x)
img = np.zeros((size, size))
for k in range(waves):
    theta = k * np.pi / waves
    img += np.cos(np.cos(theta) * X + np.sin(theta) * Y + phase)
img = (img - img.min()) / (img.max() - img.min())
result = np.round(img * 255).astype(np.int64)
