"""Read a verl launch script: the Hydra overrides given to ``verl.trainer.main_ppo``.

Line continuations are joined; shell variables set in the script (``NAME=value``, ``export NAME=...``,
``NAME=${NAME:-default}``) are expanded where they are used; a variable the script does not set is
left as written. A variable used unquoted as a whole word, whose value is several ``key=value`` words
(``ACTOR_CONFIG="a.b=1 c.d=2"`` then ``$ACTOR_CONFIG``), gives each word, as the shell splits it. A
``case`` block runs its matching arm only, and an ``if`` / ``elif`` / ``else`` block the branch whose test
holds (``[ ... ]`` and ``[[ ... ]]`` tests of strings and integers joined by ``&&``, ``||``, ``!`` and
``{ ...; }``), a variable the script does not set being empty there, as in a shell started without it;
where a test cannot be decided here (``$#``, a file test, a command), every branch counts. Shell
plumbing (``$@``, ``2>&1``, ``| tee log``) and ``--config-path`` are not overrides and are dropped.

``--config-name`` (or ``-cn``) picks one of verl's trainer configs; ``read_script`` puts the rlcore
settings it implies ahead of the script's overrides, so an explicit override wins. What a config name
implies is declared by the core and the plugins (``VerlKeys.config_names``: a config name that
chooses a backend is that backend's plugin's to declare); a name nobody declares is ignored with the
reason, and the job starts from rlcore's defaults.
"""

from __future__ import annotations

import fnmatch
import re
import shlex

import attrs

from rlcore.config.overrides import VerlMapping, verl_mapping
from rlcore.errors import ConfigError

_ASSIGNMENT = re.compile(r"^(?:export\s+|readonly\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# $NAME, ${NAME}, ${NAME:-default}; ${1:-default} too: a positional parameter the script is run without
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:?[-=])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_ENDS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "1>&2"}


_ARITHMETIC = re.compile(r"\$\(\(([A-Za-z0-9_+\-*/ ()]+)\)\)")
_ARRAY_USE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
_BARE_VARIABLE = re.compile(r"^\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$")


def _words(token: str, variables: dict[str, str]) -> list[str]:
    """``token`` expanded; a bare variable whose value is several ``key=value`` words gives each
    (the shell's word splitting of an unquoted ``$NAME``)."""
    value = _expand(token, variables)
    words = value.split()
    if _BARE_VARIABLE.match(token) and len(words) > 1 and all("=" in word for word in words):
        return words
    return [value]


def _arithmetic(match: re.Match, variables: dict[str, str]) -> str:
    inner = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: variables.get(m.group(0), m.group(0)), match.group(1))
    if not re.fullmatch(r"[0-9+\-*/ ()]+", inner):
        return match.group(0)
    numbers = re.findall(r"\d+|[-+*/()]", inner)
    try:  # integers and + - * / only: shell arithmetic, with / rounding toward zero for positive numbers
        return str(int(eval("".join(n if n != "/" else "//" for n in numbers), {"__builtins__": {}})))  # noqa: S307
    except (SyntaxError, ZeroDivisionError, TypeError):
        return match.group(0)


def _expand(text: str, variables: dict[str, str]) -> str:
    text = _VARIABLE.sub(lambda m: _one(m, variables), text)
    return _ARITHMETIC.sub(lambda m: _arithmetic(m, variables), text)


def _one(match: re.Match, variables: dict[str, str]) -> str:
    name = match.group(1) or match.group(4)
    if name in variables and (variables[name] != "" or not match.group(2)):
        return variables[name]
    if match.group(2):  # ${NAME:-default}
        return _expand(match.group(3), variables)
    return match.group(0)


def _unquote(text: str) -> str:
    try:
        parts = shlex.split(text, comments=True)
    except ValueError:
        return text
    return " ".join(parts)


@attrs.frozen
class VerlScript:
    """What a verl launch script asks of ``entry``, as rlcore overrides."""

    overrides: list[str]  # the settings its config name implies, then the script's own overrides
    config_name: str | None  # its --config-name, without ".yaml"; None when it names none
    notes: list[str]  # what the config name was taken as
    ignored: list[str]  # a config name that no installed plugin declares, with why


def read_script(text: str, entry: str = "main_ppo", mapping: VerlMapping | None = None) -> VerlScript:
    """The overrides of the first command that runs ``entry``, led by what its ``--config-name`` implies
    (``mapping``: the core's and the installed plugins' verl keys, by default)."""
    own, name = _command(text, entry)
    if name is None:
        return VerlScript(own, None, [], [])
    config_names = (mapping or verl_mapping()).config_names
    if name not in config_names:
        known = ", ".join(sorted(config_names))
        return VerlScript(own, name, [], [
            f"--config-name={name} is ignored: no installed plugin declares what verl's {name!r} trainer config "
            f"sets (known: {known}); the job starts from rlcore's defaults, not from that config's"])
    implied = [f"{key}={value}" for key, value in config_names[name].items()]
    note = (f"--config-name={name} gives {', '.join(implied)}, ahead of the script's overrides" if implied else
            f"--config-name={name} is verl's default trainer config: rlcore's defaults")
    return VerlScript(implied + own, name, [note], [])


def overrides_of_script(text: str, entry: str = "main_ppo") -> list[str]:
    """The script's own overrides after the first command that runs ``entry``, variables expanded
    (without what its config name implies: ``read_script``)."""
    return _command(text, entry)[0]


def _command(text: str, entry: str) -> tuple[list[str], str | None]:
    """(the overrides, the config name) of the first command that runs ``entry``."""
    joined = re.sub(r"\\\r?\n", " ", text)
    variables: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    lines = iter(joined.splitlines())
    case, branches = _Case(), _If()
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        stripped = branches.read(case.read(stripped, variables), variables)
        if not stripped:
            continue
        if entry in stripped and ("python" in stripped or "-m" in stripped or "torchrun" in stripped):
            return _overrides(stripped[stripped.index(entry) + len(entry):], variables, arrays)
        match = _ASSIGNMENT.match(stripped) or re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\+=(\(.*)$", stripped)
        if not match:
            continue
        name, value = match.group(1), match.group(2)
        if value.startswith("("):  # an array, NAME=( item ... ) over one line or several
            while _depth(value) > 0:
                value += "\n" + next(lines, ")")
            value = _ARITHMETIC.sub(lambda m: _arithmetic(m, variables), value)
            items = [word for item in _split(value.strip()[1:-1]) for word in _words(item, variables)]
            arrays[name] = (arrays.get(name, []) if "+=" in stripped.split("(")[0] else []) + items
        else:
            while _open_quote(value):  # NAME="... over several lines ..."
                value += " " + next(lines, '"')
            variables[name] = _unquote(_expand(value, variables))
    raise ConfigError([f"no command running {entry} was found in the script"])


class _Case:
    """A ``case WORD in ... esac`` block: only the first arm whose pattern matches WORD counts, as the
    shell runs it (``dppo_tv)  CLIP_DEFAULT=0.15 ;;``); the other arms' lines are skipped. A WORD the
    script cannot know here (a command's output, ``$(...)``) takes the first arm: verl's scripts put
    their usual case first (``gpu)`` before ``npu)``)."""

    def __init__(self):
        self.word: str | None = None  # inside a block: its word, expanded
        self.matched = False  # an arm of the block has matched
        self.in_arm = False  # the lines read now belong to the matching arm

    def read(self, line: str, variables: dict[str, str]) -> str:
        """What of ``line`` the script runs: itself outside a block, the matching arm's statements
        (semicolons as line ends) inside one, else nothing."""
        opening = re.match(r"^case\s+(.+?)\s+in$", line)
        if opening:
            self.word, self.matched, self.in_arm = _unquote(_expand(opening.group(1), variables)), False, False
            return ""
        if self.word is None:
            return line
        if line == "esac":
            self.word = None
            return ""
        arm = re.match(r"^\(?([^()]+)\)\s*(.*)$", line)
        body = line
        if arm and not self.in_arm:
            patterns = [p.strip().strip("\"'") for p in arm.group(1).split("|")]
            unknown = "$" in self.word and "*" not in patterns
            self.in_arm = not self.matched and (unknown or any(fnmatch.fnmatchcase(self.word, p) for p in patterns))
            self.matched |= self.in_arm
            body = arm.group(2)
        run = self.in_arm
        if ";;" in body:
            body, self.in_arm = body.split(";;")[0], False
        return body.strip().rstrip(";").strip() if run else ""


class _If:
    """``if`` blocks, nested: a line counts when every enclosing block runs the branch it is in. A
    block whose tests are all decided runs the first branch whose test holds (or its ``else``); from a
    test that cannot be decided on, every branch of the block counts, as before this reader knew ``if``."""

    def __init__(self):
        self.blocks: list[dict] = []  # per open block: running (this branch counts), taken, undecided

    def read(self, line: str, variables: dict[str, str]) -> str:
        if not line:
            return ""
        opening = re.match(r"^(if|elif)\s+(.*?)\s*(?:;\s*then)?$", line)
        if opening and not re.search(r";\s*fi$", line):  # a one-line if ... fi stays one statement
            outer = all(block["running"] for block in self.blocks[:-1 if opening.group(1) == "elif" else None])
            if opening.group(1) == "if":
                self.blocks.append({"running": False, "taken": False, "undecided": False})
            elif not self.blocks:
                return line
            block = self.blocks[-1]
            if block["undecided"]:
                block["running"] = True
            elif block["taken"]:
                block["running"] = False
            else:
                holds = _condition(opening.group(2), variables)
                block["undecided"] = holds is None
                block["running"] = holds is not False
                block["taken"] = holds is True
            block["outer"] = outer if opening.group(1) == "if" else block.get("outer", True)
            return ""
        if line == "then" or (not self.blocks and line in ("else", "fi")):
            return "" if line == "then" else line
        if line == "else":
            block = self.blocks[-1]
            block["running"] = block["undecided"] or not block["taken"]
            return ""
        if line == "fi":
            self.blocks.pop()
            return ""
        return line if all(block["running"] for block in self.blocks) else ""


def _condition(text: str, variables: dict[str, str]) -> bool | None:
    """Whether an ``if`` test holds, or None where it cannot be decided here."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    if any("$(" in token or "`" in token for token in tokens):
        return None
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def either() -> bool | None:
        result = both()
        while peek() == "||":
            take()
            right = both()
            result = True if True in (result, right) else (None if None in (result, right) else False)
        return result

    def both() -> bool | None:
        result = single()
        while peek() == "&&":
            take()
            right = single()
            result = False if False in (result, right) else (None if None in (result, right) else True)
        return result

    def single() -> bool | None:
        token = take() if peek() is not None else ""
        if token == "!":
            inner = single()
            return None if inner is None else not inner
        if token == "{":
            inner = either()
            while peek() in (";",):
                take()
            if peek() == "}":
                take()
            return inner
        if token in ("[", "[["):
            closing = "]" if token == "[" else "]]"
            words = []
            while peek() is not None and peek() != closing:
                words.append(take())
            if peek() == closing:
                take()
            return _test(words, variables)
        raise _Undecided

    try:
        result = either()
    except (_Undecided, IndexError):
        return None
    return result if position == len(tokens) else None


class _Undecided(Exception):
    pass


def _test(words: list[str], variables: dict[str, str]) -> bool | None:
    """One ``[ ... ]`` test; variables the script does not set are empty, ``$#`` and the positional
    parameters cannot be known."""
    if any(re.search(r"\$(?:#|\{#\}|[0-9*@])", word) for word in words):
        return None
    values = [_VARIABLE.sub(lambda m: _one(m, variables) if (m.group(1) or m.group(4)) in variables
                            or m.group(2) else "", word) for word in words]
    if any("$(" in value or "`" in value for value in values):  # a command's output, known only when run
        return None
    if len(values) == 2 and values[0] in ("-n", "-z"):
        return (values[1] != "") == (values[0] == "-n")
    if len(values) == 1:
        return values[0] != ""
    if len(values) == 3 and values[1] in ("=", "==", "!="):
        return (values[0] == values[2]) == (values[1] != "!=")
    numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
               "-ge": int.__ge__}
    if len(values) == 3 and values[1] in numeric:
        try:
            return numeric[values[1]](int(values[0]), int(values[2]))
        except ValueError:
            return None
    return None


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (its closing quote is on a later line)."""
    quote = None
    for char in text:
        if quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
    return quote is not None


def _depth(text: str) -> int:
    return text.count("(") - text.count(")")


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise ConfigError([f"the script's {text[:60]!r}... cannot be read: {exc}"]) from None


_CONFIG_NAME_OPTIONS = ("--config-name", "-cn")


def _overrides(command: str, variables: dict[str, str],
               arrays: dict[str, list[str]]) -> tuple[list[str], str | None]:
    """(the overrides, the config name, without ".yaml") of a command's arguments."""
    tokens = []  # shell arithmetic first: $((a + b)) holds spaces
    for token in _split(_ARITHMETIC.sub(lambda m: _arithmetic(m, variables), command)):
        array = _ARRAY_USE.match(token)
        tokens += arrays.get(array.group(1), []) if array else [token]
    overrides, config_name = [], None
    position = 0
    while position < len(tokens):
        token = tokens[position]
        position += 1
        if token in _ENDS or token.startswith((">", "2>")):
            break
        option, equals, value = token.partition("=")
        if option in _CONFIG_NAME_OPTIONS:
            if not equals and position < len(tokens):  # --config-name NAME
                value, position = tokens[position], position + 1
            config_name = _expand(value, variables).strip("'\"").removesuffix(".yaml") or None
            continue
        if token.startswith("-") or token in ("$@", "${@}", "$*"):
            continue
        overrides += [word for word in _words(token, variables) if "=" in word]
    return overrides, config_name
