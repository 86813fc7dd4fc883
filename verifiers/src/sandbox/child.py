
# Verity sandbox child: the only process that runs untrusted code (a completion's program or a
# user's grade()). It has no verdict channel and never learns the run's nonce; it talks to the
# harness over two pipes (numbers in argv) with the wire format above. Nothing here is a defence:
# the program may rewrite this process at will; all it can change is the answers it sends, and
# the harness decides what they are worth.
import builtins as _builtins
import sys as _child_sys
import types as _types

_LIMIT = 1 << 20  # encoded bytes of one exported value before it becomes an object reference


def describe(e):
    """[built-in base class name, message, raised by a class the program defined]."""
    t = type(e)
    for k in t.__mro__:
        if getattr(_builtins, k.__name__, None) is k:
            base = k
            break
    else:
        base = BaseException
    message = ""
    if base is t:
        args = e.args
        if len(args) == 1 and type(args[0]) in (str, int, float):
            message = str(args[0])[:300]
        elif isinstance(e, SyntaxError) and type(e.msg) is str and type(e.lineno) is int:
            message = (e.msg + " (line " + str(e.lineno) + ")")[:300]
    return [base.__name__, message, base is not t]


class Objects:
    """Program objects the harness refers to by number (kept alive for the whole run)."""

    def __init__(self):
        self.table = []
        self.numbers = {}

    def ref(self, obj):
        n = self.numbers.get(id(obj))
        if n is None:
            n = len(self.table)
            self.table.append(obj)
            self.numbers[id(obj)] = n
        return {"p": n}

    def get(self, n):
        return self.table[n]


def serve_tests(request, rfd, wfd):
    objects = Objects()
    namespace = {"__name__": "solution", "__builtins__": _builtins}
    try:
        exec(compile(request["program"], "solution.py", "exec"), namespace)
    except BaseException as e:  # noqa: B036 - SystemExit and friends are failures too
        send(wfd, {"loaded": False, "error": describe(e)})
        return
    exports = {}
    for name, value in list(namespace.items()):
        if type(name) is not str or name.startswith("__"):
            continue
        if isinstance(value, _types.ModuleType):
            exports[name] = {"m": [str(value.__name__), objects.ref(value)["p"]]}
            continue
        node = encode(value, objects.ref)
        if len(_json.dumps(node)) > _LIMIT:
            node = objects.ref(value)
        exports[name] = node
    send(wfd, {"loaded": True, "exports": exports})

    def arg(node):
        return decode(node, objects.get)

    while True:
        try:
            message = recv(rfd)
        except WireError:
            return  # the harness is done
        op = message.get("op")
        try:
            target = arg(message["target"])
            if op == "call":
                kwargs = {k: arg(v) for k, v in message["kwargs"].items()}
                result = target(*[arg(a) for a in message["args"]], **kwargs)
            elif op == "getattr":
                result = getattr(target, message["name"])
            elif op == "setattr":
                result = setattr(target, message["name"], arg(message["value"]))
            elif op == "getitem":
                result = target[arg(message["key"])]
            elif op == "setitem":
                target[arg(message["key"])] = arg(message["value"])
                result = None
            elif op == "iter":
                result = iter(target)
            elif op == "next":
                try:
                    result = next(target)
                except StopIteration:
                    send(wfd, {"stop": True})
                    continue
            elif op == "len":
                result = len(target)
            elif op == "str":
                result = str(target)
            elif op == "repr":
                result = repr(target)
            else:
                raise ValueError("unknown operation")
            node = encode(result, objects.ref)
            reply = {"value": node}
            if len(_json.dumps(reply)) > MAX_MESSAGE // 2:
                reply = {"value": objects.ref(result)}
        except BaseException as e:  # noqa: B036
            reply = {"error": describe(e)}
        send(wfd, reply)


def run_grade(request, wfd):
    """Loads the user's source, then calls its grade(); an error while loading (a syntax error,
    a failed import, no grade) is marked so, for graders/validate."""
    namespace = {"__name__": "grader", "__builtins__": _builtins}
    try:
        exec(compile(request["program"], "grader.py", "exec"), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            raise NameError("the source defines no grade(sample, item) function")
    except BaseException as e:  # noqa: B036
        send(wfd, {"error": describe(e), "phase": "load"})
        return
    try:
        value = grade(request["sample"], request["item"])
    except BaseException as e:  # noqa: B036
        send(wfd, {"error": describe(e)})
        return
    if type(value) not in (float, int, bool):
        send(wfd, {"error": ["TypeError", "grade() returned " + type(value).__name__ + ", not a number", False]})
        return
    send(wfd, {"score": float(value)})


def run_cell(source, namespace):
    """Runs a notebook cell: its statements, then prints the repr of a final expression."""
    import ast
    tree = ast.parse(source, "<cell>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def show(value):
    """A tool function's result as the model reads it: text as is, plain data as JSON."""
    if value is None:
        return
    if isinstance(value, str):
        print(value)
        return
    try:
        print(_json.dumps(value))
    except (TypeError, ValueError):
        print(repr(value))


def error_line(e):
    try:
        import traceback
        return traceback.format_exception_only(type(e), e)[-1].strip()
    except BaseException:  # noqa: B036 - an exception whose str() raises
        return type(e).__name__


def serve_session(request, rfd, wfd):
    """Answers calls for a whole episode: `{"code"}` runs a cell in the model's namespace,
    `{"function", "arguments"}` calls one of the job's tool functions (loaded at the start, in
    their own namespace). Output goes to stdout; the answer says only whether the call failed."""
    cells = {"__name__": "__main__", "__builtins__": _builtins}
    functions = {"__name__": "tools", "__builtins__": _builtins}
    errors = []
    for source in request.get("functions", []):
        try:
            exec(compile(source, "tools.py", "exec"), functions)
        except BaseException as e:  # noqa: B036
            errors.append(error_line(e))
    send(wfd, {"errors": errors})
    while True:
        try:
            message = recv(rfd)
        except WireError:
            return
        error = None
        try:
            if "code" in message:
                run_cell(message["code"], cells)
            else:
                function = functions.get(message["function"])
                if not callable(function):
                    raise NameError("the tool function " + repr(message["function"]) + " is not defined")
                show(function(**message["arguments"]))
        except BaseException as e:  # noqa: B036 - SystemExit and friends fail the call too
            error = error_line(e)
        try:
            _child_sys.stdout.flush()
            _child_sys.stderr.flush()
        except BaseException:  # noqa: B036
            pass
        send(wfd, {"error": error})


def child_main():
    rfd, wfd = int(_child_sys.argv[1]), int(_child_sys.argv[2])
    request = recv(rfd)
    _child_sys.path.extend(request.get("site_paths", []))
    if request["mode"] == "grade":
        run_grade(request, wfd)
    elif request["mode"] == "session":
        serve_session(request, rfd, wfd)
    else:
        serve_tests(request, rfd, wfd)


child_main()
