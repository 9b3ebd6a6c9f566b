#!/usr/bin/env python3
"""Writes extra training prompts of the kinds prompts.py holds (topic x task, code in ten languages, arithmetic
and word problems, lists, stories and poems, how-to questions), from larger word lists, deterministic, train-only:
none equals a prompt of prompts.py (its 31 held-out prompts stay unseen). Stored as the user text's token ids
(`kiln tokenize --lines`: SmolLM2's tokenizer, the text alone tokenizes as inside the chat template, after the
user header's newline and before <|im_end|>), which train.py `--gen-prompt-ids` wraps in the chat template and
has the target answer on the GPU.

    python3 tools/dflash-train/extra_prompts.py --model .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
        # writes tools/dflash-train/extra_prompts.jsonl.gz
"""
import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prompts as base  # noqa: E402

TOPICS = base.TOPICS + [
    "rainbows", "the ocean", "honey bees", "airplanes", "the Internet", "vaccines", "photosynthesis", "black holes",
    "the water cycle", "glaciers", "deserts", "rainforests", "wind turbines", "nuclear energy", "the Moon landing",
    "ancient Egypt", "the pyramids", "the Renaissance", "the Industrial Revolution", "World War I", "the Vikings",
    "the Silk Road", "the Cold War", "the telephone", "the light bulb", "steam engines", "trains", "bicycles",
    "rockets", "satellites", "the Sun", "Mars", "Jupiter", "comets", "stars", "galaxies", "the Big Bang", "atoms",
    "molecules", "acids and bases", "chemical reactions", "evolution", "cells", "bacteria", "viruses", "fungi",
    "the human skeleton", "muscles", "the lungs", "the digestive system", "sleep", "dreams", "memory", "emotions",
    "habits", "exercise", "nutrition", "vitamins", "water", "salt", "sugar", "coffee", "tea", "chocolate",
    "cheese", "rice", "pizza", "gardening", "composting", "bird migration", "whales", "dolphins", "sharks",
    "octopuses", "elephants", "lions", "wolves", "penguins", "butterflies", "ants", "spiders", "frogs", "snakes",
    "horses", "dogs", "cats", "owls", "eagles", "forests", "rivers", "mountains", "islands", "caves", "lakes",
    "weather", "hurricanes", "tornadoes", "lightning", "snow", "fog", "maps", "compasses", "clocks", "calendars",
    "the alphabet", "numbers", "fractions", "geometry", "probability", "statistics", "algebra", "prime numbers",
    "computers", "programming", "algorithms", "databases", "encryption", "passwords", "robots",
    "artificial intelligence", "video games", "smartphones", "social media", "email", "cameras", "television",
    "radio", "movies", "theater", "painting", "sculpture", "poetry", "novels", "libraries", "museums", "schools",
    "universities", "teachers", "doctors", "farmers", "firefighters", "pilots", "architects", "bridges",
    "skyscrapers", "roads", "cities", "villages", "markets", "banks", "taxes", "budgets", "saving money",
    "credit cards", "jobs", "interviews", "teamwork", "leadership", "public speaking", "time management",
    "kindness", "patience", "courage", "honesty", "family", "holidays", "birthdays", "weddings", "festivals",
    "football", "basketball", "tennis", "swimming", "running", "yoga", "cycling", "hiking", "camping", "fishing",
    "sailing", "skiing", "the guitar", "the piano", "drums", "jazz", "opera", "dance", "languages", "grammar",
    "spelling", "handwriting", "recycling plastic", "air pollution", "clean water", "renewable energy",
]
TOPIC_TASKS = base.TOPIC_TASKS + [
    "Tell me about {t}.",
    "Why is {t} important?",
    "Write two sentences about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the most common misconceptions about {t}?",
    "Give me a short summary of {t}.",
    "What is the history of {t}?",
    "Write a haiku about {t}.",
    "Write a short story that involves {t}.",
    "List three questions a teacher could ask about {t}.",
]
CODE_TASKS = base.CODE_TASKS + [
    "checks whether a number is prime", "reverses a string", "returns the factorial of n",
    "computes the Fibonacci numbers up to n", "removes duplicates from a list", "sorts a list with bubble sort",
    "checks whether a string is a palindrome", "counts the vowels in a string", "returns the average of a list",
    "merges two sorted lists", "finds the index of an element with binary search", "converts Celsius to Fahrenheit",
    "returns the maximum of three numbers", "checks whether a number is even", "returns the length of a string",
    "reverses the words in a sentence", "computes the power of a number", "returns a list of squares from 1 to n",
    "finds the smallest element in a list", "checks whether a list is sorted", "counts the words in a sentence",
    "returns the n-th prime number", "converts an integer to a binary string", "sums the even numbers in a list",
    "returns the longest word in a sentence", "rotates a list by k positions", "checks whether a number is a "
    "perfect square", "returns the unique characters of a string", "computes the area of a circle",
    "converts a string to uppercase", "removes the vowels from a string", "returns the intersection of two lists",
    "computes the sum of a list without a built-in function", "prints a multiplication table",
    "checks whether parentheses in a string are balanced", "counts the lines in a file",
    "returns the most frequent element of a list", "splits a list into chunks of size k",
]
LANGS = base.LANGS + ["Java", "C++", "TypeScript", "Ruby", "Bash"]
THINGS = [
    "fruits", "vegetables", "animals", "birds", "fish", "insects", "trees", "flowers", "countries in Asia",
    "countries in Africa", "capital cities", "rivers", "mountains", "oceans", "planets", "colors", "sports",
    "board games", "card games", "musical instruments", "famous composers", "famous painters", "famous writers",
    "famous inventors", "inventions", "kitchen tools", "garden tools", "things to pack for a trip",
    "hobbies for adults", "hobbies for kids", "indoor activities", "outdoor activities", "healthy snacks",
    "breakfast foods", "desserts", "soups", "herbs and spices", "things found in a classroom",
    "things found in a hospital", "jobs that help people", "ways to save energy", "ways to save money",
    "ways to stay healthy", "ways to relax", "ways to be kind", "tips for studying", "tips for writing",
    "tips for a job interview", "tips for better sleep", "programming languages", "parts of a computer",
    "parts of a car", "parts of a plant", "parts of the human body", "types of clouds", "types of rocks",
    "types of energy", "types of transport", "weather words", "words that rhyme with cat",
    "English words that start with 'moon'", "synonyms for happy", "antonyms for big", "winter activities",
    "summer activities", "things to do in a city", "safety rules for swimming", "good habits",
]
CHARACTERS = [
    "a dragon", "a robot", "a little girl", "a young boy", "an old fisherman", "a curious cat", "a brave mouse",
    "a lonely whale", "a clever fox", "a tiny ant", "a wizard", "a knight", "a princess", "a pirate", "an astronaut",
    "a detective", "a baker", "a teacher", "a talking tree", "a snowman", "a ghost", "a lost puppy", "a giant",
    "a sleepy owl", "a young scientist",
]
WANTS = [
    "wants to fly", "is afraid of the dark", "finds a secret door", "wants to become a chef", "loses a friend",
    "discovers a hidden treasure", "learns to swim", "travels to the moon", "wants to win a race",
    "makes a new friend", "saves a village", "cannot sleep", "finds a magic stone", "goes to school for the first "
    "time", "gets lost in a forest", "builds a machine", "learns a lesson about honesty",
]
HOWTO = [
    "bake bread", "plant a tree", "learn to draw", "tie a tie", "change a tire", "write a resume",
    "start a small business", "learn to code", "make friends in a new city", "keep a plant alive", "cook rice",
    "make a budget", "study for an exam", "stay calm before a test", "train a puppy", "clean a laptop keyboard",
    "write a short story", "give a good presentation", "learn to play the guitar", "wake up early",
    "drink more water", "read more books", "organize my desk", "save for a vacation", "make a paper airplane",
    "brew green tea", "prepare for a marathon", "improve my handwriting", "learn a new word every day",
    "set goals for the year", "take better photos with my phone", "make a smoothie", "choose a good book",
]
PAIRS = [
    ("a lake", "a pond"), ("a virus", "a bacterium"), ("weather", "climate"), ("a frog", "a toad"),
    ("a crocodile", "an alligator"), ("a star", "a planet"), ("speed", "velocity"), ("a noun", "a verb"),
    ("RAM", "storage"), ("a list", "a tuple in Python"), ("baking soda", "baking powder"), ("a moth", "a butterfly"),
    ("a city", "a town"), ("an ocean", "a sea"), ("a comet", "an asteroid"), ("mass", "weight"),
    ("a democracy", "a monarchy"), ("a hill", "a mountain"), ("a fruit", "a vegetable"), ("a rabbit", "a hare"),
]


def build_extra(seed=9):
    """Every distinct prompt of the lists (arithmetic ~1 in 7), none equal to one of prompts.py's, shuffled."""
    rng = random.Random(seed)
    taken = {r["prompt"] for r in base.build()}
    pool = [task.format(t=t) for t in TOPICS for task in TOPIC_TASKS]
    pool += [f"Write a {lang} function that {task}." for task in CODE_TASKS for lang in LANGS]
    pool += [f"List {k} {things}." for things in THINGS for k in (3, 5, 7, 10)]
    pool += [f"Write a short story about {c} who {w}." for c in CHARACTERS for w in WANTS]
    pool += [f"How do I {h}?" for h in HOWTO] + [f"Give me tips to {h}." for h in HOWTO]
    pool += [f"What is the difference between {a} and {b}?" for a, b in PAIRS]
    for _ in range(len(pool) // 6):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        pool.append(rng.choice([
            f"What is {a} plus {b}? Explain step by step.",
            f"What is {a} times {b}? Show your work.",
            f"What is {a} minus {b}?",
            f"A box holds {b} pencils. How many pencils are in {a} boxes?",
            f"Sara had {a + b} stickers and gave away {b}. How many are left?",
            f"A train travels {a} km in {b} hours. What is its average speed?",
            f"Tom buys {b} apples at {a} cents each. How much does he pay?",
        ]))
    seen, out = set(taken), []
    for p in pool:
        if p not in seen:
            seen.add(p)
            out.append(p)
    rng.shuffle(out)
    return out


USER = 4093  # "user", after <|im_start|> and before the newline that starts the user's text


def tokenize_lines(kiln, model, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("".join(t + "\n" for t in texts))
        f.flush()
        out = subprocess.run([kiln, "tokenize", "-m", model, "--lines", f.name], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(texts):
        sys.exit(f"kiln tokenize --lines gave {len(out)} lines for {len(texts)} texts")
    return [json.loads(line)["ids"] for line in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the target GGUF (its tokenizer)")
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "..", "target", "release", "kiln"))
    ap.add_argument("--out", default=os.path.join(HERE, "extra_prompts.jsonl.gz"))
    a = ap.parse_args()
    texts = build_extra()
    # prompts.py's prompts go through the same tokenization first: wrapped in the chat template around the data's
    # first prompt, their ids must equal the data's prompt ids (made from the whole rendered template).
    data = [json.loads(line) for line in gzip.open(os.path.join(HERE, "data.jsonl.gz"), "rt")]
    data = [r for r in data if r.get("sample", 0) == 0]
    by_id = {r["id"]: r["prompt"] for r in base.build()}
    ids = tokenize_lines(a.kiln, a.model, [by_id[r["id"]] for r in data] + texts)
    p0 = data[0]["prompt_ids"]
    prefix, tail = p0[:p0.index(USER) + 2], p0[-6:]  # through the newline; <|im_end|> "\n" <|im_start|> assistant "\n"
    bad = [r["id"] for r, u in zip(data, ids) if prefix + u + tail != r["prompt_ids"]]
    if bad:
        sys.exit(f"the chat template around the user text's ids differs from the data's for prompts {bad[:10]}")
    ids = ids[len(data):]
    rows = "".join(json.dumps({"prompt": t, "ids": i}, separators=(",", ":")) + "\n" for t, i in zip(texts, ids))
    with open(a.out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:  # the same bytes each run
        z.write(rows.encode())
    print(f"{a.out}: {len(texts)} prompts ({len(data)} of prompts.py's checked against the data's prompt ids)")


if __name__ == "__main__":
    main()
