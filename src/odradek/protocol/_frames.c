/*
 * odradek.protocol._frames: checks the lengths in a request body before kio decodes it.
 *
 * kio's native reader allocates room for a compact array's elements from the array's declared
 * length before reading them. A 49-byte request whose compact array claims 2^32 - 2 elements
 * makes it ask for 34 GB; the allocation fails and Rust aborts the whole process. So the broker
 * first walks the body with the request's layout and refuses any length that cannot fit in the
 * bytes that follow it: an array of more elements than there are bytes left, a string or byte
 * field longer than what is left, a negative length other than -1 (null).
 *
 * The layout comes as a small program compiled once per (API, version) from kio's message classes
 * (odradek.protocol.frame_check), one opcode byte each:
 *
 *     1 FIXED n           skip n bytes (integers, booleans, floats, UUIDs)
 *     2 LEGACY_STRING     int16 length, -1 = null
 *     3 LEGACY_BYTES      int32 length, -1 = null
 *     4 COMPACT_BYTES     unsigned varint length + 1, 0 = null (strings and bytes)
 *     5 TAGGED            unsigned varint count, then (varint tag, varint size, size bytes)
 *     6 LEGACY_ARRAY  m   int32 count (-1 = null), then count times the m-byte program after m
 *     7 COMPACT_ARRAY m   unsigned varint count + 1 (0 = null), then likewise
 *
 * (m is a big-endian uint16.) An opcode with its high bit set (0x80) is nullable: without it, a
 * null string, bytes or array is refused, as Kafka's own parser refuses it (kio would hand the
 * handlers a None where the schema promises a list). Nothing is decoded: the walk only moves a position, so it costs a
 * few nanoseconds per field. The GIL is held (requests are small next to the records they carry).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    OP_FIXED = 1,
    OP_LEGACY_STRING = 2,
    OP_LEGACY_BYTES = 3,
    OP_COMPACT_BYTES = 4,
    OP_TAGGED = 5,
    OP_LEGACY_ARRAY = 6,
    OP_COMPACT_ARRAY = 7,
};

typedef struct {
    const uint8_t *buf;
    Py_ssize_t n;
    Py_ssize_t pos;
    char message[160];
} walk_t;

static int fail(walk_t *w, const char *what) {
    snprintf(w->message, sizeof(w->message), "%s at byte %zd", what, w->pos);
    return -1;
}

static int uvarint(walk_t *w, uint32_t *out) {
    uint32_t value = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (w->pos >= w->n)
            return fail(w, "a varint is cut short");
        uint8_t b = w->buf[w->pos++];
        value |= (uint32_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = value;
            return 0;
        }
    }
    return fail(w, "a varint is too long");
}

static int int_be(walk_t *w, int width, int64_t *out) {
    if (w->n - w->pos < width)
        return fail(w, "a length is cut short");
    int64_t value = (int8_t)w->buf[w->pos]; /* sign of the first byte */
    for (int i = 1; i < width; i++)
        value = value * 256 + w->buf[w->pos + i];
    w->pos += width;
    *out = value;
    return 0;
}

static int skip(walk_t *w, int64_t count, const char *what) {
    if (count < 0 || count > w->n - w->pos)
        return fail(w, what);
    w->pos += (Py_ssize_t)count;
    return 0;
}

static int run(walk_t *w, const uint8_t *prog, Py_ssize_t length, int depth) {
    if (depth > 32)
        return fail(w, "the layout nests too deeply");
    Py_ssize_t pc = 0;
    while (pc < length) {
        uint8_t op = prog[pc] & 0x7F;
        int nullable = prog[pc] & 0x80;
        pc++;
        int64_t value;
        uint32_t uvalue;
        switch (op) {
        case OP_FIXED:
            if (pc >= length || skip(w, prog[pc++], "a fixed-size field is cut short") < 0)
                return -1;
            break;
        case OP_LEGACY_STRING:
        case OP_LEGACY_BYTES:
            if (int_be(w, op == OP_LEGACY_STRING ? 2 : 4, &value) < 0)
                return -1;
            if (value == -1 && !nullable)
                return fail(w, "a non-nullable field is null");
            if (value != -1 && skip(w, value, "a string or bytes length does not fit") < 0)
                return -1;
            break;
        case OP_COMPACT_BYTES:
            if (uvarint(w, &uvalue) < 0)
                return -1;
            if (uvalue == 0 && !nullable)
                return fail(w, "a non-nullable field is null");
            if (uvalue > 0 && skip(w, (int64_t)uvalue - 1, "a compact length does not fit") < 0)
                return -1;
            break;
        case OP_TAGGED: {
            if (uvarint(w, &uvalue) < 0)
                return -1;
            if ((int64_t)uvalue > w->n - w->pos)
                return fail(w, "a tagged field count does not fit");
            for (uint32_t i = 0; i < uvalue; i++) {
                uint32_t tag, size;
                if (uvarint(w, &tag) < 0 || uvarint(w, &size) < 0)
                    return -1;
                if (skip(w, size, "a tagged field does not fit") < 0)
                    return -1;
            }
            break;
        }
        case OP_LEGACY_ARRAY:
        case OP_COMPACT_ARRAY: {
            if (length - pc < 2)
                return fail(w, "a malformed layout program");
            Py_ssize_t sub = (prog[pc] << 8) | prog[pc + 1];
            pc += 2;
            if (sub > length - pc)
                return fail(w, "a malformed layout program");
            int64_t count;
            if (op == OP_LEGACY_ARRAY) {
                if (int_be(w, 4, &count) < 0)
                    return -1;
                if (count < -1)
                    return fail(w, "an array length is negative");
            } else {
                if (uvarint(w, &uvalue) < 0)
                    return -1;
                count = (int64_t)uvalue - 1;
            }
            if (count == -1 && !nullable)
                return fail(w, "a non-nullable array is null");
            /* Every element of a real layout takes at least one byte; none is longer than the
             * bytes left, whatever its layout (kio would allocate for them all). */
            if (count > w->n - w->pos)
                return fail(w, "an array claims more elements than there are bytes left");
            for (int64_t i = 0; sub > 0 && i < count; i++)
                if (run(w, prog + pc, sub, depth + 1) < 0)
                    return -1;
            pc += sub;
            break;
        }
        default:
            return fail(w, "a malformed layout program");
        }
    }
    return 0;
}

static PyObject *LengthError;

PyDoc_STRVAR(check_doc,
"check(frame, offset, program) -> end\n\n"
"Walk `frame` from `offset` with the layout `program` (see the module comment); return where\n"
"the walk ended, or raise LengthError(message) for a length that cannot fit.");

static PyObject *check(PyObject *self, PyObject *args) {
    Py_buffer frame, program;
    Py_ssize_t offset;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*:check", &frame, &offset, &program))
        return NULL;
    walk_t w = {(const uint8_t *)frame.buf, frame.len, offset, {0}};
    int result = -1;
    if (offset < 0 || offset > frame.len)
        fail(&w, "an offset outside the frame");
    else
        result = run(&w, (const uint8_t *)program.buf, program.len, 0);
    PyBuffer_Release(&frame);
    PyBuffer_Release(&program);
    if (result < 0) {
        PyErr_SetString(LengthError, w.message);
        return NULL;
    }
    return PyLong_FromSsize_t(w.pos);
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, check_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    LengthError = PyErr_NewExceptionWithDoc("odradek.protocol._frames.LengthError",
                                            "A length in a request that cannot fit.",
                                            PyExc_ValueError, NULL);
    if (LengthError == NULL)
        return -1;
    return PyModule_AddObjectRef(module, "LengthError", LengthError);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "odradek.protocol._frames",
    "Length checks of request bodies before kio decodes them (see odradek.protocol.frame_check).",
    0,
    methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModuleDef_Init(&module_def); }
