"""A small inspect-ai task for `candor serve` (run by harness_twice.sh): short arithmetic and
fact questions, scored by `includes()`. The point is not the score but that two runs through
inspect's `openai-api` provider give identical completions."""
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

QUESTIONS = [
    ("What is 2 + 2? Answer with a number.", "4"),
    ("What is the capital of France?", "Paris"),
    ("What color is the sky on a clear day?", "blue"),
    ("How many days are in a week?", "7"),
    ("What is the opposite of hot?", "cold"),
    ("Which planet do we live on?", "Earth"),
    ("What is 10 minus 3? Answer with a number.", "7"),
    ("What animal says 'meow'?", "cat"),
    ("How many legs does a spider have?", "8"),
    ("What is frozen water called?", "ice"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What language is spoken in Spain?", "Spanish"),
]


@task
def candor_small():
    return Task(
        dataset=[Sample(input=q, target=a, id=i) for i, (q, a) in enumerate(QUESTIONS)],
        solver=generate(),
        scorer=includes(),
    )
