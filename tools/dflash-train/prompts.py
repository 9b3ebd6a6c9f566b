#!/usr/bin/env python3
"""Writes the DFlash training prompt set (prompts.jsonl): chat questions, code, math, lists, stories, explanations,
rewriting. Hand-written prompts plus templated ones (topic x task), deterministic, so the file can be regenerated.
Every 10th prompt (after a fixed shuffle) is held out for evaluation: split "test", the rest "train".

    python3 tools/dflash-train/prompts.py            # writes tools/dflash-train/prompts.jsonl
"""
import json
import os
import random

HAND = [
    # chat / general knowledge
    "What is the capital of France?",
    "How do airplanes stay in the air?",
    "Why is the sky blue?",
    "What are the benefits of regular exercise?",
    "How can I improve my sleep?",
    "What is the difference between weather and climate?",
    "Give me some tips for learning a new language.",
    "How does a refrigerator work?",
    "What causes the seasons on Earth?",
    "Can you recommend a good way to start journaling?",
    "What should I pack for a weekend camping trip?",
    "How do vaccines work?",
    "What is photosynthesis?",
    "How do I make a good cup of coffee?",
    "What is the tallest mountain in the world?",
    "Why do cats purr?",
    "How does the internet work?",
    "What is the water cycle?",
    "How can I be more productive when working from home?",
    "What are some healthy breakfast ideas?",
    "What is a black hole?",
    "How do I write a good cover letter?",
    "What are the main causes of climate change?",
    "How do bees make honey?",
    "Explain how a rainbow forms.",
    "What is the difference between a virus and a bacterium?",
    "How do I prepare for a job interview?",
    "What is inflation?",
    "Why do leaves change color in autumn?",
    "How do I start running if I am a beginner?",
    "What is the meaning of the word 'ephemeral'?",
    "Who wrote Romeo and Juliet?",
    "How many planets are in the solar system?",
    "What is the speed of light?",
    "How does a compass work?",
    "What are good habits for saving money?",
    "How do I take care of a houseplant?",
    "What is machine learning?",
    "How does a car engine work?",
    "What is democracy?",
    # code
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function to reverse a string.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that computes the Fibonacci numbers up to n.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a SQL query that selects all users older than 30 from a table called users.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "How do I read a file line by line in Python?",
    "Write a bash command that counts the lines in all .txt files in a directory.",
    "Explain what a for loop is in programming, with an example.",
    "Write a Python function that sorts a list of dictionaries by the key 'age'.",
    "What is the difference between a list and a tuple in Python?",
    "Write a C function that swaps two integers using pointers.",
    "Write a Python script that prints the numbers from 1 to 100, but prints Fizz for multiples of 3 and Buzz for multiples of 5.",
    "Write a function in Python that checks if a string is a palindrome.",
    "Explain recursion with a simple Python example.",
    "Write an HTML page with a heading and a paragraph.",
    "Write a Python function that merges two sorted lists.",
    "How do I create a virtual environment in Python?",
    "Write a Java method that returns the maximum of an array of integers.",
    "What does the git commit command do?",
    "Write a Python function that counts the vowels in a string.",
    "Write a binary search function in Python.",
    "Explain what an API is.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    # math
    "What is 15 times 12?",
    "Solve for x: 2x + 6 = 14.",
    "What is the area of a circle with radius 5?",
    "If a train travels 60 miles per hour for 3 hours, how far does it go?",
    "What is 25% of 80?",
    "Explain the Pythagorean theorem.",
    "What is the derivative of x squared?",
    "A shop sells apples for 2 dollars each. How much do 7 apples cost?",
    "What is the sum of the angles in a triangle?",
    "Convert 3/4 to a decimal.",
    "What is the square root of 144?",
    "Tom has 12 marbles and gives 5 to his friend. How many does he have left?",
    "What is a prime number? Give some examples.",
    "Calculate the perimeter of a rectangle that is 8 cm long and 5 cm wide.",
    "What is 1000 divided by 8?",
    "Explain what a fraction is to a child.",
    "If I save 50 dollars a month, how much will I have after two years?",
    "What is the average of 4, 8, 15, 16, 23 and 42?",
    "Solve: 3(x - 2) = 12.",
    "What is the volume of a cube with side length 4?",
    # lists
    "List five fruits that are high in vitamin C.",
    "List ten countries in Europe.",
    "Give me a list of five classic novels.",
    "List the steps to make a peanut butter sandwich.",
    "Name five famous scientists and what they are known for.",
    "List some ways to reduce stress.",
    "Give me a list of ten animals that live in the ocean.",
    "List the days of the week in French.",
    "List five tips for staying focused while studying.",
    "Name the primary colors.",
    "List some common programming languages and what they are used for.",
    "Give me a shopping list for a pasta dinner.",
    "List the planets in order from the sun.",
    "List five indoor activities for a rainy day.",
    "Name three types of renewable energy.",
    # stories / creative
    "Write a short story about a dragon who is afraid of the dark.",
    "Write a poem about the ocean.",
    "Tell me a story about a robot who wants to become a chef.",
    "Write a short story about a lost puppy finding its way home.",
    "Write a haiku about autumn.",
    "Write a bedtime story about a sleepy owl.",
    "Tell me a joke about computers.",
    "Write a short story set on a space station.",
    "Write a poem about friendship.",
    "Write a story about a girl who discovers a secret garden.",
    "Write a limerick about a cat.",
    "Describe a sunset at the beach.",
    "Write a short fairy tale about a brave mouse.",
    "Write a diary entry of a pirate.",
    "Write a short mystery story in five sentences.",
    # rewriting / instructions
    "Summarize the plot of Cinderella in three sentences.",
    "Rewrite this sentence to be more formal: hey, can u send me the report asap?",
    "Translate 'Good morning, how are you?' into Spanish.",
    "Write an email to my boss asking for a day off.",
    "Write a thank-you note to a teacher.",
    "Give me a recipe for pancakes.",
    "Write a product description for a reusable water bottle.",
    "Write a short speech for a friend's birthday.",
    "Explain the rules of chess briefly.",
    "Write a motivational message for someone starting a new job.",
]

TOPICS = [
    "gravity", "the French Revolution", "electricity", "the human heart", "volcanoes", "the stock market",
    "recycling", "the moon", "dinosaurs", "the Roman Empire", "earthquakes", "solar panels", "the immune system",
    "money", "DNA", "the printing press", "the Great Wall of China", "tides", "magnets", "music",
    "the brain", "clouds", "bread", "electric cars", "the Olympic Games", "coral reefs", "batteries",
    "friendship", "chess", "trees",
]
TOPIC_TASKS = [
    "Explain {t} in simple terms.",
    "Write a short paragraph about {t}.",
    "Give me three interesting facts about {t}.",
    "Write a short poem about {t}.",
    "What should a student know about {t}?",
]
CODE_TASKS = [
    "finds the largest element in a list",
    "counts how many times each word appears in a text",
    "checks whether two strings are anagrams",
    "computes the greatest common divisor of two numbers",
    "returns the sum of the digits of a number",
    "flattens a nested list",
    "removes all spaces from a string",
    "returns the second smallest number in a list",
    "converts a binary string to an integer",
    "checks whether a year is a leap year",
    "capitalizes the first letter of every word in a sentence",
    "returns the n-th triangular number",
]
LANGS = ["Python", "JavaScript", "C", "Rust", "Go"]


def build():
    rng = random.Random(8)
    prompts = list(HAND)
    for t in TOPICS:
        for task in rng.sample(TOPIC_TASKS, 3):
            prompts.append(task.format(t=t))
    for i, task in enumerate(CODE_TASKS):
        for lang in (LANGS[i % 5], LANGS[(i + 2) % 5], LANGS[(i + 4) % 5]):
            prompts.append(f"Write a {lang} function that {task}.")
    for _ in range(45):
        a, b = rng.randint(3, 99), rng.randint(3, 99)
        kind = rng.randrange(4)
        if kind == 0:
            prompts.append(f"What is {a} plus {b}? Explain step by step.")
        elif kind == 1:
            prompts.append(f"What is {a} times {b}? Show your work.")
        elif kind == 2:
            prompts.append(f"A box holds {a} pencils. How many pencils are in {b} boxes?")
        else:
            prompts.append(f"Sara had {a + b} stickers and gave away {b}. How many are left?")
    for n, things in [(5, "vegetables"), (7, "musical instruments"), (6, "board games"), (4, "seasons and one thing to do in each"),
                      (5, "famous paintings"), (8, "kitchen tools"), (5, "ways to save water"), (6, "sports played with a ball"),
                      (5, "birds"), (10, "English words that start with 'sun'")]:
        prompts.append(f"List {n} {things}.")
    seen, out = set(), []
    for p in prompts:
        if p not in seen:
            seen.add(p)
            out.append(p)
    rng.shuffle(out)
    return [{"id": i, "split": "test" if i % 10 == 0 else "train", "prompt": p} for i, p in enumerate(out)]


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl")
    rows = build()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    n_test = sum(r["split"] == "test" for r in rows)
    print(f"{path}: {len(rows)} prompts, {n_test} held out")


if __name__ == "__main__":
    main()
