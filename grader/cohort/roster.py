"""The sample cohort's roster: names for the gradebook, as an instructor's CSV would give them.

    id,first_name,last_name,email

`write_roster` writes it beside the submissions (build_cohort does); `grader roster FILE` or
`grader collect --from DIR --roster FILE` imports it with nbgrader's own `nbgrader db student import`.
A student without a surname here (one added to students.py later) still gets a name: their id, capitalised.
"""
from __future__ import annotations

import csv
from pathlib import Path

SURNAMES = {
    "ada": "Okafor", "untouched": "Nobody", "basil": "Hughes", "cleo": "Marchetti", "dario": "Ferreira",
    "elif": "Yilmaz", "fumi": "Tanaka", "gus": "Lindqvist", "hana": "Novak", "ivo": "Petrov", "jun": "Park",
    "kai": "Kealoha", "lena": "Schmidt", "mo": "Haddad", "nils": "Berg", "oona": "Virtanen", "pia": "Rossi",
    "quinn": "Byrne", "rui": "Costa", "sam": "Adeyemi", "tess": "Walsh", "mallory": "Black", "rhea": "Kapoor",
    "nico": "Alvarez", "xena": "Papadakis", "wren": "Mbeki", "yuki": "Sato", "uma": "Iyer", "vito": "Greco",
    "vera": "Horvat", "ines": "Moreau", "otto": "Lindgren", "lotte": "Brandt",
}


def roster_rows(students) -> list[dict]:
    return [{"id": s.name, "first_name": s.name.capitalize(), "last_name": SURNAMES.get(s.name, "Sample"),
             "email": f"{s.name}@students.example.edu"} for s in students]


def write_roster(path: Path, students) -> Path:
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "first_name", "last_name", "email"])
        w.writeheader()
        w.writerows(roster_rows(students))
    return path
