"""D2Q9 lattice Boltzmann (BGK) flow around a cylinder, periodic box (after Philip Mocz's lbm tutorial)."""
import numpy as np

Nx, Ny, tau, Nt = 60, 24, 0.6, 30  # size
NL = 9
idxs = np.arange(NL)
cxs = np.array([0, 0, 1, 1, 1, 0, -1, -1, -1])
cys = np.array([0, 1, 1, 0, -1, -1, -1, 0, 1])
weights = np.array([4 / 9, 1 / 9, 1 / 36, 1 / 9, 1 / 36, 1 / 9, 1 / 36, 1 / 9, 1 / 36])
F = np.ones((Ny, Nx, NL)) + 0.01 * np.sin(np.arange(Ny * Nx * NL).reshape(Ny, Nx, NL))
F[:, :, 3] += 2.3
X, Y = np.meshgrid(range(Nx), range(Ny))
cylinder = (X - Nx / 4) ** 2 + (Y - Ny / 2) ** 2 < (Ny / 4) ** 2
for it in range(Nt):
    for i, cx, cy in zip(idxs, cxs, cys):
        F[:, :, i] = np.roll(F[:, :, i], cx, axis=1)
        F[:, :, i] = np.roll(F[:, :, i], cy, axis=0)
    bndryF = F[cylinder, :]
    bndryF = bndryF[:, [0, 5, 6, 7, 8, 1, 2, 3, 4]]
    rho = np.sum(F, 2)
    ux = np.sum(F * cxs, 2) / rho
    uy = np.sum(F * cys, 2) / rho
    Feq = np.zeros(F.shape)
    for i, cx, cy, w in zip(idxs, cxs, cys, weights):
        Feq[:, :, i] = rho * w * (1 + 3 * (cx * ux + cy * uy) + 9 * (cx * ux + cy * uy) ** 2 / 2
                                  - 3 * (ux ** 2 + uy ** 2) / 2)
    F += -(1.0 / tau) * (F - Feq)
    F[cylinder, :] = bndryF
result = np.stack([rho, ux, uy])
