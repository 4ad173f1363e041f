"""The tensors of a file written by LibTorch's torch::serialize::OutputArchive (a ZeRO shard of
kit/train/zero_checkpoint.cpp), read without torch, so that `kit check` can compare a
checkpoint's contents with the solution's on any machine.

Such a file is a zip archive in TorchScript's format: <name>/data.pkl is a pickle of a module
object whose attributes are the archive's keys ("0", "1", ...), each a tensor that the pickle
rebuilds with torch._utils._rebuild_tensor_v2 from a storage named by a persistent id; the
storage's bytes are the entry <name>/data/<storage key>, little-endian. Only what is needed here
is understood: dense tensors of the float, double, int and long types.
"""
import array
import pickle
import sys
import zipfile

# A storage's type, as the pickle names it less its "Storage" ending -> the array module's type
# code and its size.
TYPES = {"Float": ("f", 4), "Double": ("d", 8), "Int": ("i", 4), "Long": ("q", 8)}
STORAGE = "Storage"


class Tensor:
    """One tensor of the archive: its values (a flat list, in storage order) and its shape."""

    def __init__(self, values, shape):
        self.values, self.shape = values, tuple(shape)

    def __len__(self):
        return len(self.values)


class _Object:
    """Whatever class the pickle names (the module, an OrderedDict): keeps its state."""

    def __init__(self, *args):
        self.state = {}

    def __setstate__(self, state):
        self.state = state if isinstance(state, dict) else {}

    def __setitem__(self, key, value):  # an OrderedDict the pickle fills item by item
        self.state[key] = value


class _Reader(pickle.Unpickler):
    def __init__(self, file, storages):
        super().__init__(file)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild
        if module == "torch" and name.endswith(STORAGE):
            return name[:-len(STORAGE)]
        return _Object

    def persistent_load(self, pid):
        # ('storage', <type>, key, location, numel)
        return (pid[1], str(pid[2]))

    def rebuild(self, storage, offset, size, stride, *rest):
        kind, key = storage
        code, width = TYPES.get(kind, (None, 0))
        if code is None:
            raise ValueError(f"a tensor of {kind} {STORAGE.lower()}, which the check does not read")
        values = array.array(code)
        values.frombytes(self.storages(key))
        if sys.byteorder != "little":
            values.byteswap()
        n = 1
        for s in size:
            n *= s
        return Tensor(values[offset:offset + n], size)


def tensors(path):
    """{key: Tensor} of the archive at `path`. Raises OSError or ValueError when it is not one."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl")), None)
            if pkl is None:
                raise ValueError(f"{path}: not a LibTorch archive (no data.pkl)")
            base = pkl[:-len("data.pkl")]
            with z.open(pkl) as f:
                obj = _Reader(f, lambda key: z.read(f"{base}data/{key}")).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, KeyError, EOFError) as e:
        raise ValueError(f"{path}: not a readable LibTorch archive ({e})") from e
    state = obj.state if isinstance(obj, _Object) else {}
    return {str(k): v for k, v in state.items() if isinstance(v, Tensor)}
