"""The user prompts of the demo SAE's training chats: topic x template pairs drawn with a seed, one
in twelve under a persona system prompt, and hand-written ones (greetings, translations, code,
maths, styles). The demo model writes the answers (scripts/build_demo_sae.py)."""

from __future__ import annotations

import random

SEED = 1234
N_TOPIC_PROMPTS = 960

# Everyday topics for the model's own chat answers (the docs on this machine are all technical).
TOPICS = """
the ocean|sharks|whales|coral reefs|the beach|sailing|fishing|rivers and lakes|rain|snow|
thunderstorms|the weather|climate change|volcanoes|earthquakes|mountains|deserts|forests|
the jungle|autumn leaves|spring flowers|gardening|houseplants|trees|bees|butterflies|birds|
dogs|cats|horses|elephants|lions|penguins|dinosaurs|insects|farm animals|pets|
Paris|France|French cuisine|Italy|Rome|pizza|pasta|Japan|Tokyo|sushi|China|India|Mexico|
tacos|Spain|Germany|London|New York City|Egypt|the pyramids|Brazil|Australia|Canada|Africa|
the Moon|Mars|the solar system|black holes|stars|astronauts|rockets|telescopes|
cooking dinner|baking bread|chocolate|coffee|tea|breakfast|vegetables|fruit|cheese|soup|
a birthday party|wine|restaurants|street food|desserts|ice cream|spicy food|healthy eating|
football|basketball|tennis|the Olympics|running|swimming|cycling|yoga|chess|video games|
board games|music|the piano|the guitar|jazz|rock music|classical music|singing|dancing|
painting|photography|movies|theatre|poetry|novels|libraries|museums|
programming in Python|JavaScript|writing clean code|databases|computers|the internet|
smartphones|artificial intelligence|robots|video calls|email|passwords and security|
mathematics|prime numbers|geometry|physics|chemistry|biology|the human brain|sleep|dreams|
medicine|doctors|hospitals|exercise|vitamins|the common cold|mental health|meditation|
money|saving money|banks|the stock market|starting a business|marketing|job interviews|
working from home|teachers|school|university|homework|learning a language|history|
ancient Rome|the Middle Ages|castles|knights|pirates|the Vikings|world wars|democracy|
elections|the law|friendship|love|weddings|families|grandparents|babies|holidays|Christmas|
Halloween|a road trip|trains|airplanes|cars|electric cars|bicycles|cities|villages|camping|
hiking|a picnic|the weekend|shopping|fashion|shoes|cleaning the house|moving to a new home|
recycling|solar power|wind turbines|water|fire|time|happiness|kindness|courage|a rainy day
"""
TEMPLATES = [
    "Tell me about {t}.",
    "What do you know about {t}?",
    "Write a short story about {t}.",
    "Write a short poem about {t}.",
    "Give me three interesting facts about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the pros and cons of {t}?",
    "Write a list of five tips about {t}.",
    "Why do people like {t}?",
    "Describe {t} in a few sentences.",
    "What is your opinion on {t}?",
    "Write a short blog post about {t}.",
]
EXTRA_PROMPTS = [
    "Hi! How are you today?",
    "What's your name?",
    "Can you help me with my homework?",
    "What should I cook for dinner tonight?",
    "Plan a three-day trip to Paris for me.",
    "Translate 'good morning, how are you?' into French.",
    "Translate 'I love the sea' into Spanish.",
    "Say hello in five different languages.",
    "Écris une courte phrase en français sur la mer.",
    "¿Cuál es la capital de España?",
    "Bonjour ! Comment ça va ?",
    "Wie spät ist es in Berlin?",
    "Write a Python function that reverses a string.",
    "Write a Python function to compute factorials.",
    "How do I read a file in Python?",
    "What is a for loop?",
    "Explain recursion with an example.",
    "Write a SQL query that counts the rows of a table.",
    "What does HTML stand for?",
    "Fix this code: print('hello'",
    "How do I sort a list in JavaScript?",
    "What is 17 times 23?",
    "What is the square root of 144?",
    "Solve 2x + 3 = 11.",
    "How many days are in a leap year?",
    "What is the capital of Australia?",
    "Who wrote Romeo and Juliet?",
    "Who was Napoleon?",
    "When did humans land on the Moon?",
    "WRITE YOUR ANSWER IN CAPITAL LETTERS: WHAT IS YOUR FAVOURITE COLOUR?",
    "Answer in one word: what colour is the sky?",
    "Give me a numbered list of healthy snacks.",
    "Write a haiku about the sea.",
    "Tell me a joke.",
    "Tell me a joke about computers.",
    "Write a limerick about a cat.",
    "Write a motivational quote.",
    "Write a formal business email asking for a meeting.",
    "Write a text message inviting a friend to dinner.",
    "Summarise the plot of Cinderella.",
    "I feel sad today.",
    "I just got a new job!",
    "Can you recommend a good book?",
    "What's the best way to learn to swim?",
    "How do airplanes fly?",
    "Why is the sky blue?",
    "How do I make pancakes?",
    "What is the recipe for a French omelette?",
    "What should I pack for a beach holiday?",
    "How do I take care of a puppy?",
    "What are the rules of chess?",
    "Describe a sunset over the ocean.",
    "Describe a busy market in Marrakech.",
    "What is the meaning of life?",
    "Are you conscious?",
    "What can you do?",
    "Who made you?",
    "Write a dialogue between a pirate and a robot.",
    "Talk like a pirate and tell me about treasure.",
    "Pretend you are a cat and describe your day.",
    "Write a very angry complaint about a late train.",
    "Write an excited announcement that school is closed for snow!",
    "Give me a shopping list for a barbecue.",
    "What's the difference between weather and climate?",
    "Explain photosynthesis.",
    "How does the heart work?",
    "What are the planets in our solar system?",
    "What is gravity?",
    "Compare cats and dogs as pets.",
    "Write a thank-you note to a teacher.",
    "What is your favourite food?",
    "How was your day?",
    "What did you do last summer?",
    "What are your plans for tomorrow?",
    "Write a short speech for a wedding.",
    "Give me advice for a first date.",
    "How do I stay calm before an exam?",
    "Write instructions for planting tomatoes.",
    "What is inflation?",
    "How do I save for retirement?",
]
SYSTEM_PROMPTS = [
    "You are a friendly assistant who answers briefly.",
    "You are a pirate. Always talk like a pirate.",
    "You are a French tutor. Answer in French.",
    "You are an expert chef.",
    "You are a helpful coding assistant.",
    "You are a poet who answers in rhyme.",
]


def chat_prompts() -> list[list[dict]]:
    """The training chats' opening turns, in order (seeded)."""
    rng = random.Random(SEED)
    topics = [t.strip() for t in TOPICS.replace("\n", "").split("|") if t.strip()]
    pairs = [(t, tpl) for t in topics for tpl in TEMPLATES]
    rng.shuffle(pairs)
    conversations = []
    for i, (topic, template) in enumerate(pairs[:N_TOPIC_PROMPTS]):
        messages = [{"role": "user", "content": template.format(t=topic)}]
        if i % 12 == 5:  # one in twelve gets a persona system prompt
            messages.insert(
                0, {"role": "system", "content": SYSTEM_PROMPTS[(i // 12) % len(SYSTEM_PROMPTS)]}
            )
        conversations.append(messages)
    conversations += [[{"role": "user", "content": p}] for p in EXTRA_PROMPTS]
    return conversations
