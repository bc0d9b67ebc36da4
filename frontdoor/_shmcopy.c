/* zinfer.frontdoor._shmcopy: memcpy between a caller's mapped shared-memory segment and the front door's
 * memory that survives the segment being truncated under it.
 *
 * Why: the kernel's read and write paths for a tmpfs file (preadv, pwrite) cost 2.5 to 3.5 times a memcpy
 * of the same bytes (a page-cache lookup and a copy per 4 KiB page); bench/probe_big_shm.py measures both.
 * Copying through a mapping of the caller's segment is a plain memcpy, but a segment truncated under the
 * mapping turns the copy's next access into SIGBUS, which would end the process. Here a copy runs with a
 * SIGBUS handler that, for a fault inside the ranges of the copy this thread is making, jumps back out
 * of the copy: the call returns False and the caller reports the region as smaller than registered. Every
 * other SIGBUS goes to the handler that was there before (Python's faulthandler, or the default action).
 *
 * copy(dst, dst_offset, src, src_offset, nbytes) -> bool: the bytes [src_offset, src_offset + nbytes) of
 * the buffer src into dst at dst_offset (both ranges are checked against the buffers: IndexError), with
 * the GIL released. False when the copy hit SIGBUS (dst then holds part of the bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

static __thread __attribute__((tls_model("initial-exec"))) sigjmp_buf *volatile guard_jump;  /* set while this thread copies */
static __thread __attribute__((tls_model("initial-exec"))) const char *volatile guard_range[2][2];  /* [dst, src][start, end) of that copy */
static struct sigaction previous;  /* the SIGBUS handler before ours */
static int installed;
static volatile sig_atomic_t passed_on;  /* a SIGBUS not ours was handed back once */

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    sigjmp_buf *jump = guard_jump;
    if (jump != NULL && info != NULL && info->si_code > 0) { /* a fault, not a signal someone sent */
        const char *at = (const char *)info->si_addr;
        for (int i = 0; i < 2; i++) {
            if (at >= guard_range[i][0] && at < guard_range[i][1]) {
                guard_jump = NULL;
                siglongjmp(*jump, 1);
            }
        }
    }
    /* Not a fault of a guarded copy: hand SIGBUS back to the handler that was there before ours (the
     * default action the second time round, so that two handlers passing it to each other cannot loop)
     * and let it happen again: a fault re-runs the instruction that faulted, a signal sent by a process
     * is raised again (pending until this handler returns). */
    struct sigaction back = previous;
    if (passed_on) {
        memset(&back, 0, sizeof back);
        back.sa_handler = SIG_DFL;
        sigemptyset(&back.sa_mask);
    }
    passed_on = 1;
    sigaction(sig, &back, NULL);
    installed = 0;
    if (info == NULL || info->si_code <= 0)
        raise(sig);
    (void)context;
}

/* Ours installed, keeping whatever is there now as the one to pass other faults to (a handler installed
 * after ours, such as faulthandler enabled later, would otherwise take the guarded faults). */
static int ensure_handler(void)
{
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0)
        return -1;
    if (installed && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)
        return 0;
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGBUS, &ours, &previous) != 0)
        return -1;
    installed = 1;
    return 0;
}

static PyObject *shm_copy(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer dst, src;
    Py_ssize_t dst_offset, src_offset, nbytes;
    if (!PyArg_ParseTuple(args, "w*ny*nn", &dst, &dst_offset, &src, &src_offset, &nbytes))
        return NULL;
    if (nbytes < 0 || dst_offset < 0 || src_offset < 0 || dst_offset > dst.len - nbytes ||
        src_offset > src.len - nbytes) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_IndexError, "copy: a range lies outside its buffer");
        return NULL;
    }
    if (ensure_handler() != 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    char *to = (char *)dst.buf + dst_offset;
    const char *from = (const char *)src.buf + src_offset;
    volatile int faulted = 0;
    sigjmp_buf jump;
    Py_BEGIN_ALLOW_THREADS
    guard_range[0][0] = to;
    guard_range[0][1] = to + nbytes;
    guard_range[1][0] = from;
    guard_range[1][1] = from + nbytes;
    if (sigsetjmp(jump, 1) == 0) {
        guard_jump = &jump;
        __asm__ volatile("" ::: "memory"); /* the guard is set before the copy starts (volatile: not */
        memcpy(to, from, (size_t)nbytes);  /* a store the compiler may drop as overwritten below) */
        __asm__ volatile("" ::: "memory");
    } else {
        faulted = 1;
    }
    guard_jump = NULL;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    if (faulted)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"copy", shm_copy, METH_VARARGS,
     "copy(dst, dst_offset, src, src_offset, nbytes) -> bool: False when a segment was truncated under "
     "the copy (SIGBUS)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shmcopy", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__shmcopy(void)
{
    return PyModule_Create(&module);
}
