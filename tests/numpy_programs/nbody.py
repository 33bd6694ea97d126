"""Direct-summation n-body gravity, leapfrog integration (after Philip Mocz's nbody tutorial)."""
import numpy as np

N, steps, dt, soft, G = 48, 20, 0.01, 0.1, 1.0  # size
i = np.arange(N)
pos = np.stack([np.sin(i * 1.3), np.cos(i * 0.7), np.sin(i * 0.11) * 0.5], axis=1)
vel = np.zeros((N, 3))
mass = np.ones((N, 1)) * 20.0 / N


def acceleration(pos, mass):
    x = pos[:, 0:1]
    y = pos[:, 1:2]
    z = pos[:, 2:3]
    dx = x.T - x
    dy = y.T - y
    dz = z.T - z
    inv_r3 = (dx ** 2 + dy ** 2 + dz ** 2 + soft ** 2) ** (-1.5)
    ax = G * (dx * inv_r3) @ mass
    ay = G * (dy * inv_r3) @ mass
    az = G * (dz * inv_r3) @ mass
    return np.hstack((ax, ay, az))


acc = acceleration(pos, mass)
for _ in range(steps):
    vel += acc * dt / 2.0
    pos += vel * dt
    acc = acceleration(pos, mass)
    vel += acc * dt / 2.0
result = np.concatenate([pos, vel], axis=1)
