"""Linearized 2-D shallow water equations on a periodic grid (forward-backward time stepping with np.roll)."""
import numpy as np

nx, ny, steps = 40, 32, 40  # size
g, H, dt, dx = 9.81, 10.0, 0.01, 1.0
x = np.arange(nx) * dx
y = np.arange(ny) * dx
X, Y = np.meshgrid(x, y)
h = np.exp(-((X - 20.0) ** 2 + (Y - 16.0) ** 2) / 20.0)
u = np.zeros((ny, nx))
v = np.zeros((ny, nx))
for _ in range(steps):
    u = u - g * dt / (2 * dx) * (np.roll(h, -1, axis=1) - np.roll(h, 1, axis=1))
    v = v - g * dt / (2 * dx) * (np.roll(h, -1, axis=0) - np.roll(h, 1, axis=0))
    h = h - H * dt / (2 * dx) * (np.roll(u, -1, axis=1) - np.roll(u, 1, axis=1)
                                 + np.roll(v, -1, axis=0) - np.roll(v, 1, axis=0))
result = np.stack([h, u, v])
