"""Writes drafter_prompts.json: the 255 hand-written prompts, then prompts composed from templates.

    python mlxspec/data/compose_drafter_prompts.py

`mlxspec train-drafter` records the target's answers to these prompts in order until it has the
tokens asked for; 255 prompts give ~54,000 answer tokens from a small model, and a head learns
more from more answers (held-out top-1 rose ~7 points from 15k to 30k tokens), so the set goes on
with ~1,500 composed chat prompts of the same kinds (stories, explanations, tips, how-tos,
comparisons, letters, descriptions, poems, code, questions), interleaved so that any prefix of the
list mixes them in proportion. The free-form benchmark prompts (benchmarks/prompts/free_form.json) and their
subjects are left out, so benchmarks measure on prompts no head trained on. Deterministic.
"""

from __future__ import annotations

import itertools
import random
import json
from pathlib import Path

HERE = Path(__file__).parent
HAND_WRITTEN = 255  # the first entries of the file, kept as they are

CHARACTERS = ["a young baker", "an old clockmaker", "a curious fox", "a lonely astronaut", "a shy librarian",
              "a retired pirate", "a brave little mouse", "a street musician", "a forgetful wizard", "a girl with a love of maps",
              "a tired night guard", "a talking teapot", "a beekeeper", "a lost puppy", "a grumpy giant",
              "a young inventor", "a mail carrier", "a penguin with big dreams", "a gardener", "a knight afraid of horses",
              "a sleepless owl", "a boy with a stone collection", "a farmer", "a cloud", "a clever crow",
              "a school bus driver", "a tiny snail", "a mountain guide", "a painter with no colours left", "a ghost"]
EVENTS = ["finds a hidden door", "loses something precious", "makes an unexpected friend", "wins a strange contest",
          "gets lost on the way home", "discovers a secret garden", "has to keep a promise", "meets a dragon",
          "learns to be patient", "finds a map in an old book", "saves a village", "builds something new",
          "travels to the sea for the first time", "hears a mysterious song", "must solve a puzzle before sunset"]
THINGS = ["a bicycle pump", "a thermostat", "a compass", "a solar panel", "a lock and key", "an electric kettle",
          "a camera", "a hot air balloon", "a washing machine", "a vending machine", "a smoke detector", "a lighthouse",
          "a toaster", "a water filter", "an elevator", "a wind turbine", "a battery", "a telescope", "a barcode scanner",
          "a zipper", "a dishwasher", "a traffic light", "a piano", "an umbrella", "a submarine", "a parachute",
          "a heat pump", "a microphone", "a sewing machine", "a GPS receiver", "a clock", "a dam", "a bridge",
          "a loudspeaker", "an airplane wing", "a calculator", "a printer", "a vacuum cleaner", "a sailboat", "a volcano"]
WHY = ["the sky is blue", "leaves change colour in autumn", "we need sleep", "bread rises", "ice floats",
       "the moon has phases", "cats purr", "the sea is salty", "we get hiccups", "birds migrate", "metal feels cold",
       "onions make us cry", "stars twinkle", "we have seasons", "popcorn pops", "the ocean has waves",
       "some animals hibernate", "we yawn", "wood floats", "thunder follows lightning"]
ACTIVITIES = ["learning a new language", "saving money", "sleeping better", "running a first 5k", "studying for exams",
              "cooking for one", "keeping a tidy desk", "starting a vegetable garden", "writing a cover letter",
              "staying focused while working from home", "travelling on a budget", "making friends in a new city",
              "caring for a new puppy", "reading more books", "drinking more water", "public speaking",
              "taking better photos", "staying safe while hiking", "packing for a trip", "learning to draw",
              "preparing for a job interview", "keeping a journal", "reducing food waste", "riding a bike in the city",
              "organizing a birthday party", "learning to swim", "practising the guitar", "staying warm in winter",
              "eating more vegetables", "managing stress"]
TASKS = ["boil an egg", "change a flat tire", "make a paper airplane", "plant a tree", "clean a cast iron pan",
         "tie a tie", "write a haiku", "make a budget", "brew a good cup of tea", "fold a fitted sheet",
         "start a campfire safely", "sew on a button", "make pancakes", "back up my photos", "set up a fish tank",
         "learn to juggle", "make a simple website", "train a dog to sit", "bake a loaf of bread", "remove a coffee stain",
         "write a thank-you email", "prepare for a long flight", "care for a cactus", "make a smoothie", "repot a plant"]
PAIRS = [("tea", "coffee"), ("trains", "buses"), ("the sun", "the moon"), ("dogs", "rabbits"), ("books", "films"),
         ("summer", "winter"), ("cities", "villages"), ("walking", "cycling"), ("email", "letters"), ("rivers", "lakes"),
         ("pencils", "pens"), ("bees", "wasps"), ("frogs", "toads"), ("oceans", "deserts"), ("chess", "checkers"),
         ("violins", "cellos"), ("apples", "oranges"), ("mountains", "beaches"), ("owls", "hawks"), ("jam", "honey")]
LETTERS = [("a thank-you note", "a neighbour who watered my plants"), ("a short letter", "my future self"),
           ("an apology note", "a friend whose party I missed"), ("a welcome message", "a new colleague"),
           ("a letter", "my grandmother about my first week at school"), ("a postcard", "my family from the mountains"),
           ("a short complaint", "a shop about a broken kettle"), ("a note", "a teacher who helped me"),
           ("an invitation", "friends for a picnic on Saturday"), ("a farewell message", "a coworker who is leaving"),
           ("a recommendation", "a friend about a book I loved"), ("a request", "a landlord to fix the heating")]
PLACES = ["a busy train station", "a quiet library at night", "a market in the morning", "an old lighthouse",
          "a snowy forest", "a small harbour", "a bakery at dawn", "a desert at sunset", "a rainy city street",
          "a child's bedroom", "a mountain cabin", "a crowded beach", "a school playground", "a space station",
          "a coral reef", "a country fair", "an empty theatre", "an autumn park", "a night sky in the countryside", "a garden after rain"]
POEM_TOPICS = ["the first snow", "a cup of tea", "the sea at night", "an old friend", "a city morning", "autumn leaves",
               "a cat asleep in the sun", "the stars", "a long road", "spring rain", "a lighthouse", "the wind",
               "a library", "home", "a river", "the moon", "a garden", "a train journey", "the mountains", "a candle"]
CODE = ["reverses a string", "checks whether a number is prime", "counts the vowels in a word",
        "removes duplicates from a list", "returns the factorial of n", "checks whether a word is a palindrome",
        "merges two sorted lists", "finds the most common word in a text", "converts Celsius to Fahrenheit",
        "returns the n-th Fibonacci number", "flattens a nested list", "sums the digits of a number",
        "counts how often each letter appears in a string", "capitalizes every word in a sentence",
        "checks whether two words are anagrams", "returns the average of a list of numbers",
        "finds the longest word in a sentence", "splits a list into chunks of size n", "rotates a list by k places",
        "checks whether brackets in a string are balanced"]
CONCEPTS = ["gravity", "inflation", "a food chain", "democracy", "an ecosystem", "the water cycle", "a black hole",
            "compound interest", "an algorithm", "the immune system", "a metaphor", "climate", "friction",
            "a vaccine", "electricity", "evolution", "a budget", "the internet", "an atom", "a calorie",
            "recycling", "a solar eclipse", "a habit", "renewable energy", "a museum", "a haiku", "a tsunami",
            "a password manager", "photosynthesis in plants", "the stock market"]
NUMBERS = ["three", "four", "five", "six", "seven"]
BENCHMARK_SUBJECTS = ("robot", "paint", "sailor", "whale", "refrigerator", "rainbow", "houseplant", "second largest")


def composed() -> list[list[str]]:
    """One list of prompts per kind."""
    stories = [f"{verb} a short story about {c} who {e}."
               for (c, e), verb in zip(itertools.product(CHARACTERS, EVENTS), itertools.cycle(["Write", "Tell"]))]
    random.Random(0).shuffle(stories)  # not every story of one character in a row
    explain = [f"Explain how {t} works." for t in THINGS] + [f"How does {t} work? Explain simply." for t in THINGS]
    why = [f"Explain why {w}." for w in WHY]
    tips = [f"List {n} tips for {a}." for a, n in zip(ACTIVITIES, itertools.cycle(NUMBERS))]
    tips += [f"Give me advice on {a}." for a in ACTIVITIES]
    howto = [f"How do I {t}? Give clear steps." for t in TASKS]
    compare = [f"Compare {a} and {b}." for a, b in PAIRS] + [f"What are the differences between {a} and {b}?" for a, b in PAIRS]
    letters = [f"Write {kind} to {who}." for kind, who in LETTERS]
    describe = [f"Describe {p} in a few sentences." for p in PLACES] + [f"Write a paragraph that describes {p}." for p in PLACES]
    poems = [f"Write a short poem about {t}." for t in POEM_TOPICS] + [f"Write a haiku about {t}." for t in POEM_TOPICS]
    code = [f"Write a Python function that {c}." for c in CODE]
    concepts = [f"What is {c}? Explain it to a beginner." for c in CONCEPTS] + [f"Explain {c} in simple words." for c in CONCEPTS]
    return [stories, explain, why, tips, howto, compare, letters, describe, poems, code, concepts]


def main() -> None:
    path = HERE / "drafter_prompts.json"
    hand = json.loads(path.read_text())[:HAND_WRITTEN]
    free_form = json.loads((HERE.parent.parent / "benchmarks" / "prompts" / "free_form.json").read_text())["free_form"]
    seen = set(hand) | set(free_form)
    out = list(hand)
    groups = composed()  # spread evenly: the i-th of a group of n stands at i / n of the list
    spread = sorted((i / len(g), k, p) for k, g in enumerate(groups) for i, p in enumerate(g))
    for _, _, prompt in spread:
        if prompt not in seen and not any(s in prompt.lower() for s in BENCHMARK_SUBJECTS):
            seen.add(prompt)
            out.append(prompt)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{path}: {len(out)} prompts ({len(out) - len(hand)} composed)")


if __name__ == "__main__":
    main()
