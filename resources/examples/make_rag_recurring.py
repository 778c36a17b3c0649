"""Writes rag-recurring.csv, a workload for rag.tmpl whose retrieved passages recur.

Real retrieval traffic repeats itself: a few passages answer most questions. Each row's three
passages are drawn without replacement from POOL with Zipf (s = 1) popularity, so the passage at
rank k is drawn with weight 1/k; c1 is the first drawn. The question is one written for c1 when
an unused one is left, else for c2 or c3, so questions stay varied. The draw uses only
random.Random(SEED).random(), whose sequence Python keeps stable, so running

    python resources/examples/make_rag_recurring.py

from the repository root rewrites the identical file.
"""
from __future__ import annotations

import csv
import io
import random
from pathlib import Path

SEED = 2024
ROW_COUNT = 48
OUTPUT = Path(__file__).resolve().with_name("rag-recurring.csv")

# (passage, questions it answers), most popular first: list order is the Zipf rank.
POOL: list[tuple[str, list[str]]] = [
    ("E-115 means the Wi-Fi connection was lost; the battery keeps working, but the app shows old data.",
     ["The app hasn't updated since yesterday and shows E-115. Is my battery still working?",
      "What does E-115 mean?",
      "Do I need an installer to fix E-115?",
      "My neighbour's router went down and now my app shows E-115. Is the battery at risk?",
      "The app shows the same charge level all day. Why isn't it changing?",
      "Does the battery stop backing up my home when the Wi-Fi is down?",
      "E-115 came back after I changed my Wi-Fi password. What now?"]),
    ("The backup reserve is 20 percent by default; change it under Settings, then Backup, then Reserve.",
     ["How do I keep more charge for power cuts?",
      "Why does my battery stop discharging at 20 percent every evening?",
      "Can I set the backup reserve to zero?",
      "A storm is forecast. How do I make sure the battery is full for an outage?",
      "Where do I change the backup reserve in the app?",
      "The battery still had 20 percent left but the house drew from the grid. Why?"]),
    ("To restart, choose Settings, then System, then Restart in the app; the system is back within two minutes.",
     ["How do I restart the battery from my phone?",
      "How long does a restart take?",
      "Should I switch off the main breaker to reset the battery?",
      "Support told me to restart the system. Where do I find that?",
      "The app froze on the home screen. Is it safe to restart the battery?"]),
    ("The gateway supports 2.4 GHz Wi-Fi networks only; 5 GHz networks do not appear in the list.",
     ["My home network doesn't show up when I pair the gateway. Why?",
      "Can the gateway use my 5 GHz Wi-Fi?",
      "I got a new mesh router. Will the battery connect to it?",
      "Which Wi-Fi band should I give the gateway?"]),
    ("In Time-Based Control the battery charges during the off-peak hours you set and discharges at peak rates.",
     ["What does Time-Based Control do?",
      "Why does my battery wait until 6 pm to discharge?",
      "Is Time-Based Control worth it on a flat-rate tariff?"]),
    ("During an outage only circuits wired to the backup panel have power; other outlets stay off.",
     ["The power went out and my kitchen sockets were dead though the battery was full. Why?",
      "Which circuits does the battery power in a blackout?",
      "Can my electric car charge from the battery during an outage?"]),
    ("Firmware updates install automatically at night; if an update fails, the app shows E-501.",
     ["I see E-501 this morning. What happened?",
      "Do I have to install firmware updates myself?",
      "Is there a charge for firmware updates?"]),
    ("The installer must register the system within 60 days; an unregistered system has a 5-year warranty.",
     ["How do I know whether my installer registered my battery?",
      "My installer closed down before registering the system. What warranty do I have?",
      "Why does the app say my warranty is only five years?"]),
    ("E-310 is a cell voltage imbalance; charging is limited while the cells rebalance, which can take a day.",
     ["My battery only charges to 80 percent and shows E-310. Is it broken?",
      "How long does E-310 last?",
      "E-310 keeps coming back every week. Who should I call?"]),
    ("Keep 30 cm clear on each side of the unit and 60 cm in front, and store no fuel within 1 metre.",
     ["Can I stack storage boxes next to the battery in my garage?",
      "Is it safe to keep a petrol can beside the battery?",
      "How much space does the battery need around it?"]),
    ("The HB-10 delivers 5 kW continuously and 7.5 kW for up to 10 seconds.",
     ["Can my HB-10 run the oven and the kettle at the same time?",
      "What is the peak output of an HB-10?",
      "Will an HB-10 start my well pump during an outage?"]),
    ("Helios Support is open Monday to Saturday, 8:00 to 20:00; the emergency line answers 24 hours a day.",
     ["Can I call support on a Sunday?",
      "What are your support hours?",
      "Who do I call at midnight if the battery is hissing?"]),
    ("Charging pauses below freezing and resumes once the cells reach 5 degrees C; E-101 then clears by itself.",
     ["My outdoor battery didn't charge during the cold snap. Is it faulty?",
      "What does E-101 mean?",
      "Should I move my battery indoors for the winter?"]),
    ("A warranty claim starts with Helios Support, which reviews remote diagnostic data before deciding.",
     ["How do I make a warranty claim?",
      "Can you approve my warranty claim now?",
      "What does Helios look at when I file a claim?"]),
    ("The app shows lifetime throughput under System, then Statistics; the HB-15 warranty ends at 55 MWh.",
     ["Where can I see how much energy my battery has delivered?",
      "How close is my HB-15 to its warranty throughput limit?",
      "What does throughput mean for my warranty?"]),
    ("E-230 means the grid frequency is out of range; the system reconnects within five minutes once it settles.",
     ["The app showed E-230 during a storm. Should I worry?",
      "Why did my battery disconnect from the grid for a few minutes?",
      "What does E-230 mean?"]),
]


def draw_passages(rng: random.Random, k: int = 3) -> list[int]:
    """k distinct pool indices; each draw weighs the remaining index i by 1/(i + 1)."""
    remaining = list(range(len(POOL)))
    drawn = []
    for _ in range(k):
        weights = [1.0 / (i + 1) for i in remaining]
        target = rng.random() * sum(weights)
        pick = len(remaining) - 1  # guards against rounding at the top end
        for pos, w in enumerate(weights):
            target -= w
            if target < 0:
                pick = pos
                break
        drawn.append(remaining.pop(pick))
    return drawn


def make_rows(seed: int = SEED, count: int = ROW_COUNT) -> list[dict[str, str]]:
    rng = random.Random(seed)
    asked: dict[str, int] = {}
    seen: set[tuple[int, int, int, str]] = set()
    rows = []
    for _ in range(count):
        picks = draw_passages(rng)
        # c1 is the best match, as a retriever ranks it: ask an unused question of c1, else of c2, c3
        options = next(([q for q in POOL[i][1] if q not in asked] for i in picks
                        if any(q not in asked for q in POOL[i][1])), None)
        if options is None:  # all asked already: the least asked, never repeating a whole row
            options = [q for i in picks for q in POOL[i][1] if (*picks, q) not in seen]
            fewest = min(asked[q] for q in options)
            options = [q for q in options if asked[q] == fewest]
        question = options[int(rng.random() * len(options))]
        asked[question] = asked.get(question, 0) + 1
        seen.add((*picks, question))
        c1, c2, c3 = (POOL[i][0] for i in picks)
        rows.append({"c1": c1, "c2": c2, "c3": c3, "question": question})
    return rows


def repeats(rows: list[dict[str, str]]) -> tuple[int, int]:
    """How many rows repeat an earlier row's <c1>, and how many its <c1> and <c2> together:
    what a cache of earlier rows can reuse beyond the static prefix."""
    seen_c1, seen_c12 = set(), set()
    rep_c1 = rep_c12 = 0
    for r in rows:
        rep_c1 += r["c1"] in seen_c1
        rep_c12 += (r["c1"], r["c2"]) in seen_c12
        seen_c1.add(r["c1"])
        seen_c12.add((r["c1"], r["c2"]))
    return rep_c1, rep_c12


def render_csv(rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["c1", "c2", "c3", "question"], lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main() -> None:
    rows = make_rows()
    OUTPUT.write_bytes(render_csv(rows).encode("ascii"))
    print(f"wrote {OUTPUT.name}: {len(rows)} rows from a pool of {len(POOL)} passages")


if __name__ == "__main__":
    main()
