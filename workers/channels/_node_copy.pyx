# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled same-node put/take of channel buffers: handshake flags and a copy shared by both sides, in shared memory.

Used by :class:`~nbmpi.workers.channels.channel.ArrayChannel` between two ranks of one
node whose buffers live in :class:`~nbmpi.workers.channels.shared_memory.NodeSegments`
(each rank has mapped the other's buffer). One transfer moves the sender's
whole buffer into the receiver's with ONE copy (MPI needs two: sender -> bounce
buffer -> receiver), cut into pieces (the caller chooses the piece size, see
``channels._shm_chunk``) that both ranks copy at the same time.

Protocol of the k-th transfer (k = 1, 2, ...) on one directed pair, all in a
:data:`CONTROL_BYTES` control block in shared memory: three counters that only
grow and one claim word, each on its own cache line, zero when the segment is created:

* ``sready``: the sender stores k on entering its k-th put (its data is final).
  ``rready``: the receiver stores 2k-1 on entering its k-th take (its buffer may
  be overwritten); the sender waits for it and claims it with a compare-and-swap
  to 2k. Until then the receiver may withdraw (:func:`withdraw_take`, back to
  2k-2): that is how a take times out or is interrupted without breaking the
  channel, like a cancelled MPI receive. The receiver waits for ``sready >= k``.
* ``claim``: one word, ``k mod 2**24`` | next piece from the front | end of the
  unclaimed pieces at the back (20 bits each). The first side to reach transfer
  k opens it (``k | 0 | n`` for ``n`` pieces, compare-and-swap; the word of
  transfer k-1 has every piece claimed by then). The ``front`` side (the lower
  rank of the pair, in both directions) claims pieces from the front, the other
  from the back, one compare-and-swap per piece, until they meet. So each rank
  copies the same part of both buffers every time (that part stays in its core's
  cache: measured on a 2-core machine, a 64 KiB ping-pong one way took 1.2 us
  this way against 7.5 us with one rank copying, the copy across cores being
  bound by one core's outstanding cache misses), and a side that is descheduled
  (another process on its core) does not hold the transfer up: the running side
  claims the rest.
* ``done``: pieces copied, added after each copy (release). Both sides return
  when it reaches ``k*n`` (acquire): the data is in the receiver's buffer and
  the sender's buffer is free again.

Waiting polls with the CPU's pause hint and yields the core (``sched_yield``)
between polling rounds, as MPICH's own progress loop does
(``MPIR_CVAR_POLLS_BEFORE_YIELD``). The round adapts, like an adaptive mutex:
about twice the recent waits that polling alone ended (so a partner on another
core is caught without giving the core away), shorter while waits keep ending
only after a yield (both ranks share one core on a loaded machine: the partner
needs this core), at most ``spin_s``.
A call works for at most ``budget_s`` seconds with the GIL released and returns
False if the transfer is not complete by then; calling again with the same
arguments resumes it (every step is idempotent), which is how the caller
enforces timeouts and lets Ctrl-C in.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #include <stdint.h>
    #include <sched.h>
    #include <time.h>
    #if defined(__x86_64__) || defined(__i386__)
    #include <immintrin.h>
    #define NBMPI_PAUSE() _mm_pause()
    #elif defined(__aarch64__) || defined(__arm__)
    #define NBMPI_PAUSE() __asm__ __volatile__("yield" ::: "memory")
    #else
    #define NBMPI_PAUSE() __asm__ __volatile__("" ::: "memory")
    #endif
    static inline uint64_t nbmpi_load(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void nbmpi_store(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int nbmpi_cas(uint64_t *p, uint64_t *expected, uint64_t desired) {
        return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE); }
    static inline void nbmpi_add(uint64_t *p, uint64_t v) { (void)__atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
    static inline int64_t nbmpi_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
    }
    static inline void nbmpi_pause(void) { NBMPI_PAUSE(); }
    static inline void nbmpi_yield(void) { sched_yield(); }
    """
    uint64_t nbmpi_load(uint64_t *p) nogil
    void nbmpi_store(uint64_t *p, uint64_t v) nogil
    int nbmpi_cas(uint64_t *p, uint64_t *expected, uint64_t desired) nogil
    void nbmpi_add(uint64_t *p, uint64_t v) nogil
    int64_t nbmpi_now() nogil
    void nbmpi_pause() nogil
    void nbmpi_yield() nogil

#: Bytes of the control block of one directed pair (four 64-byte cache lines, zeroed at creation).
CONTROL_BYTES = 256

cdef enum:
    W_SREADY = 0     # word indices: one counter per 64-byte line
    W_RREADY = 8
    W_CLAIM = 16
    W_DONE = 24


cdef struct Spin:
    int64_t avg_ns      # moving average of the waits that ended while polling (no yield)
    int64_t max_ns      # never poll longer than this between yields


cdef struct Poll:
    unsigned int n
    int64_t t_begin     # clock at the first check of this wait (0: not checked yet)
    int64_t t_round     # start of the current polling round
    int yielded


cdef inline int64_t spin_budget(Spin *sp) noexcept nogil:
    cdef int64_t b = 2 * sp.avg_ns + 2000
    return b if b < sp.max_ns else sp.max_ns


cdef inline int poll_step(Poll *p, Spin *sp, int64_t deadline) noexcept nogil:
    """One unsuccessful poll: pause; every 32 polls check the deadline (1 = passed) and yield the
    core after each polling round (adaptive length, see Pair)."""
    cdef int64_t t
    nbmpi_pause()
    p.n += 1
    if (p.n & 31) == 0:
        t = nbmpi_now()
        if t >= deadline:
            return 1
        if p.t_begin == 0:
            p.t_begin = p.t_round = t
        elif t - p.t_round >= spin_budget(sp):
            nbmpi_yield()
            p.yielded = 1
            p.t_round = nbmpi_now()
    return 0


cdef inline void poll_done(Poll *p, Spin *sp) noexcept nogil:
    """Learn from a wait that ended: if polling alone ended it, move the average towards its
    length; if it took a yield (the partner needed this core, or was not running), shrink it."""
    if p.t_begin == 0:
        return
    if p.yielded:
        sp.avg_ns -= sp.avg_ns // 4
    else:
        sp.avg_ns += (nbmpi_now() - p.t_begin - sp.avg_ns) // 8


cdef int wait_ge(uint64_t *w, uint64_t v, int64_t deadline, Spin *sp) noexcept nogil:
    """Wait until ``*w >= v``. 1 = deadline passed."""
    cdef Poll p
    p.n = 0
    p.t_begin = p.t_round = 0
    p.yielded = 0
    while nbmpi_load(w) < v:
        if poll_step(&p, sp, deadline):
            return 1
    poll_done(&p, sp)
    return 0


cdef int match_receiver(uint64_t *rr, uint64_t k, int64_t deadline, Spin *sp) noexcept nogil:
    """Sender: wait for the receiver's k-th take (``rready == 2k-1``) and claim it (CAS to ``2k``), so
    that the receiver can no longer withdraw it. ``rready >= 2k``: already matched (the receiver may
    even have completed the transfer alone and moved on). 1 = deadline passed."""
    cdef Poll p
    cdef uint64_t r
    p.n = 0
    p.t_begin = p.t_round = 0
    p.yielded = 0
    while True:
        r = nbmpi_load(rr)
        if r >= 2 * k:
            break
        if r == 2 * k - 1:
            if nbmpi_cas(rr, &r, 2 * k):
                break
            continue
        if poll_step(&p, sp, deadline):
            return 1
    poll_done(&p, sp)
    return 0


cdef enum:
    K_SHIFT = 40     # claim word: transfer number (24 bits) | next front piece (20) | end of the back (20)
    LO_SHIFT = 20

#: Most pieces one transfer can have (the claim word holds piece indices in 20 bits).
MAX_PIECES = (1 << 20) - 1
cdef uint64_t M20 = (1 << 20) - 1
cdef uint64_t M24 = (1 << 24) - 1


cdef int c_transfer(uint64_t *ctl, char *src, char *dst, size_t nbytes, size_t chunk, uint64_t k,
                    int sender, int front, int64_t budget_ns, Spin *sp) noexcept nogil:
    cdef int64_t t0 = nbmpi_now()
    cdef int64_t deadline = t0 + budget_ns
    cdef uint64_t npieces = (nbytes + chunk - 1) // chunk if nbytes else 0
    cdef uint64_t end = k * npieces
    cdef uint64_t kf = k & M24
    cdef uint64_t w, wk, lo, hi, i
    cdef size_t off, n
    if sender:
        if nbmpi_load(ctl + W_SREADY) < k:
            nbmpi_store(ctl + W_SREADY, k)
        if match_receiver(ctl + W_RREADY, k, deadline, sp):
            return 1
    else:
        if nbmpi_load(ctl + W_RREADY) < 2 * k - 1:
            nbmpi_store(ctl + W_RREADY, 2 * k - 1)
        if wait_ge(ctl + W_SREADY, k, deadline, sp):
            return 1
    if npieces:
        w = nbmpi_load(ctl + W_CLAIM)
        while True:
            wk = w >> K_SHIFT
            if wk != kf:
                if wk == ((k - 1) & M24):      # transfer k not opened yet: open it (both sides may try)
                    nbmpi_cas(ctl + W_CLAIM, &w, (kf << K_SHIFT) | npieces)
                    w = nbmpi_load(ctl + W_CLAIM)
                    continue
                break                          # a later transfer is open: every piece of k was copied
            lo = (w >> LO_SHIFT) & M20
            hi = w & M20
            if lo >= hi:
                break                          # every piece claimed
            if front:
                i = lo
                if not nbmpi_cas(ctl + W_CLAIM, &w, (kf << K_SHIFT) | ((lo + 1) << LO_SHIFT) | hi):
                    continue                   # w now holds the current word
            else:
                i = hi - 1
                if not nbmpi_cas(ctl + W_CLAIM, &w, (kf << K_SHIFT) | (lo << LO_SHIFT) | (hi - 1)):
                    continue
            off = <size_t>i * chunk
            n = nbytes - off if nbytes - off < chunk else chunk
            memcpy(dst + off, src + off, n)
            nbmpi_add(ctl + W_DONE, 1)
            if nbmpi_now() >= deadline:
                return 1
            w = nbmpi_load(ctl + W_CLAIM)
    return wait_ge(ctl + W_DONE, end, deadline, sp)


cdef class Pair:
    """One direction of same-node put/take between this rank and one peer (this rank's side of it).

    ``ctl`` is the address of the pair's control block (:data:`CONTROL_BYTES`,
    zeroed once, in memory both ranks map), ``src``/``dst`` the addresses of the
    sender's and the receiver's buffers of ``nbytes`` each (both mapped here),
    ``chunk`` the piece size (the same on both sides, > 0, at most :data:`MAX_PIECES`
    pieces), ``sender`` which side this rank is, ``front`` whether it claims pieces from
    the front (True on exactly one rank of the pair, the same for both directions).
    ``keep`` holds the objects that keep those mappings alive.
    The partner rank makes the matching calls on its own Pair. Not thread-safe:
    one thread (the one that calls MPI) uses it.

    ``k`` is the number of the current (or last) transfer, ``t_start`` /
    ``t_end`` its times in ns on ``time.perf_counter_ns``'s clock (CLOCK_MONOTONIC).
    """

    cdef uint64_t *ctl
    cdef char *src
    cdef char *dst
    cdef readonly size_t nbytes
    cdef readonly size_t chunk
    cdef readonly bint sender
    cdef readonly bint front
    cdef public uint64_t k
    cdef readonly int64_t t_start
    cdef readonly int64_t t_end
    cdef readonly object keep
    cdef Spin spin

    def __init__(self, size_t ctl, size_t src, size_t dst, size_t nbytes, size_t chunk, bint sender,
                 bint front, object keep=None):
        if chunk == 0 or ctl == 0 or src == 0 or dst == 0:
            raise ValueError("Pair: addresses and chunk must be non-zero")
        if (nbytes + chunk - 1) // chunk > MAX_PIECES:
            raise ValueError(f"Pair: {nbytes} bytes in pieces of {chunk} is more than {MAX_PIECES} pieces; "
                             "use larger pieces")
        self.ctl = <uint64_t *>ctl
        self.src = <char *>src
        self.dst = <char *>dst
        self.nbytes = nbytes
        self.chunk = chunk
        self.sender = sender
        self.front = front
        self.k = 0
        self.t_start = self.t_end = 0
        self.keep = keep
        self.spin.avg_ns = 5000
        self.spin.max_ns = 100000

    @property
    def spin_ns(self) -> int:
        """How long a wait polls now before it yields the core (adapts; see the module docstring)."""
        return spin_budget(&self.spin)

    def start(self, double budget_s, double spin_s) -> bool:
        """Begin the next transfer (``k += 1``) and work on it for at most ``budget_s`` seconds with the
        GIL released; True when it is complete, False if not yet (then call :meth:`resume`). While it
        waits it polls for at most ``spin_s`` seconds between yields of the core (less when waits
        keep needing a yield, see the module docstring)."""
        cdef int st
        cdef int64_t b = <int64_t>(budget_s * 1e9)
        self.spin.max_ns = <int64_t>(spin_s * 1e9)
        self.k += 1
        self.t_start = nbmpi_now()
        with nogil:
            st = c_transfer(self.ctl, self.src, self.dst, self.nbytes, self.chunk, self.k, self.sender,
                            self.front, b, &self.spin)
        if st == 0:
            self.t_end = nbmpi_now()
        return st == 0

    def resume(self, double budget_s, double spin_s) -> bool:
        """Go on with transfer ``k`` (same contract as :meth:`start`). Every step is idempotent."""
        cdef int st
        cdef int64_t b = <int64_t>(budget_s * 1e9)
        self.spin.max_ns = <int64_t>(spin_s * 1e9)
        with nogil:
            st = c_transfer(self.ctl, self.src, self.dst, self.nbytes, self.chunk, self.k, self.sender,
                            self.front, b, &self.spin)
        if st == 0:
            self.t_end = nbmpi_now()
        return st == 0

    def withdraw(self) -> bool:
        """Receiver: take back transfer ``k`` if the sender has not reached it; True if done (then ``k`` is
        back to the last completed transfer).

        True: the take never happened (nothing was copied; the sender, if it
        arrives, waits for the next take). False: the rendezvous took place (the
        sender claimed the take, or its data was ready and this side may have
        started copying), or this is the sender's side: the transfer must be
        completed. Local, never blocks.
        """
        cdef uint64_t r, k = self.k
        if self.sender or k == 0:
            return False
        r = nbmpi_load(self.ctl + W_RREADY)
        if r < 2 * k - 1:
            self.k -= 1                       # never announced
            return True
        if r >= 2 * k or nbmpi_load(self.ctl + W_SREADY) >= k:
            return False                      # matched, or the data was there to copy
        if nbmpi_cas(self.ctl + W_RREADY, &r, 2 * k - 2):
            self.k -= 1
            return True
        return False

    def completed(self) -> bool:
        """True if transfer ``k`` is complete (every piece copied), or ``k == 0``. Local, never blocks."""
        cdef uint64_t npieces = (self.nbytes + self.chunk - 1) // self.chunk if self.nbytes else 0
        return nbmpi_load(self.ctl + W_DONE) >= self.k * npieces
