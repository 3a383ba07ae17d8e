"""Deterministic generator for the conversational retrieval benchmark (`data/conversations_eval.json`).

Each conversation is a chat between two friends over weeks or months: 20-30 dated sessions of 10-16 turns
with greetings, small talk, reactions that echo the other person's words, plans that happen later (or change),
events "yesterday" / "last weekend", hobbies, family, work, pets, trips and preferences mentioned in passing.
Both people get same-shaped lives (a job, hobbies, a pet, relatives, trips), so a fact about one person has
look-alike facts about the other, and the turn that answers a question has neighbours sharing its words.

Questions come in four kinds, each with the keys of its evidence turns:

``single-hop``   one fact, asked with other words ("took up pottery" -> "What craft involving clay ...");
``multi-hop``    two or more turns, usually in different sessions (a relative introduced in one session and
                 named without the relation later; every hobby someone has; a plan and its change);
``temporal``     "when did X ...": the answer depends on the session's date and the turn's "yesterday";
``open-domain``  "would X probably enjoy ...?", answered from what X said about themselves.

Everything is stdlib and seeded, so the same seed gives the same file::

    python session_bench/make_conversation_dataset.py                  # (re)write the committed file
    python session_bench/make_conversation_dataset.py --check          # fail if the file is stale
    python session_bench/make_conversation_dataset.py --stats          # statistics only

No public conversational QA data set is used or imitated: every template and entity here is hand-written.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

SEED = 20261124
CONVERSATIONS = 12
OUT_PATH = Path(__file__).resolve().parent / "data" / "conversations_eval.json"
KINDS = ("single-hop", "multi-hop", "temporal", "open-domain")
KIND_SHARE = {"single-hop": 0.35, "multi-hop": 0.25, "temporal": 0.20, "open-domain": 0.20}

# -- people ---------------------------------------------------------------------------------------

NAMES = [
    ("Maya", "f"), ("Jonah", "m"), ("Priya", "f"), ("Theo", "m"), ("Lena", "f"), ("Marcus", "m"), ("Aisha", "f"),
    ("Diego", "m"), ("Hannah", "f"), ("Kofi", "m"), ("Rosa", "f"), ("Felix", "m"), ("Nadia", "f"), ("Owen", "m"),
    ("Ingrid", "f"), ("Samir", "m"), ("Clara", "f"), ("Ravi", "m"), ("Zoe", "f"), ("Mateo", "m"), ("Yuki", "f"),
    ("Elliot", "m"), ("Farah", "f"), ("Lucas", "m"),
]
PRONOUNS = {"f": {"subj": "she", "obj": "her", "poss": "her"}, "m": {"subj": "he", "obj": "him", "poss": "his"}}

# -- catalogues: the words used in turns, and other words for the same thing used in questions -------

JOBS = [
    dict(job="ICU nurse", intro=["Another night shift in the ICU, twelve hours on my feet and two codes before midnight.",
                                  "Work was rough, we had three new admissions to intensive care before my break."],
         q=["What does {P} do for a living?", "In which hospital unit is {P} employed?"],
         open=("Would {P} stay calm in a medical emergency?", "yes; {subj} works in critical care")),
    dict(job="middle school science teacher",
         intro=["My eighth graders had their science fair today, one kid built a volcano that actually erupted.",
                "Grading forty lab reports tonight, why did I assign so many experiments to the seventh grade."],
         q=["What is {P}'s profession?", "Whom does {P} instruct at work, and in which subject?"],
         open=("Would {P} likely enjoy a summer off?", "yes; teachers get the summer holidays")),
    dict(job="software developer",
         intro=["Spent all day hunting a bug in our app's checkout page, I'm completely fried.",
                "Our release slipped again, the code review queue at my company is endless."],
         q=["What is {P}'s line of work?", "What kind of technical job does {P} have?"],
         open=("Would {P} be comfortable setting up a home network?", "probably; {subj} writes programs for a living")),
    dict(job="line cook", intro=["The restaurant was slammed tonight, I plated something like two hundred dinners on the grill station.",
                                 "Chef made me run the sauté station alone during the Saturday rush, my arms are toast."],
         q=["What does {P} do for work?", "In what kind of establishment does {P} have a job?"],
         open=("Would {P} be a good person to ask for dinner party recipes?", "yes; {subj} cooks professionally")),
    dict(job="accountant", intro=["Tax season is brutal, I've been at the firm until nine every night doing returns.",
                                  "Closed the quarterly books for two clients today, spreadsheets in my dreams."],
         q=["What is {P}'s occupation?", "What does {P} do at the office?"],
         open=("Would {P} be good at planning a household budget?", "yes; {subj} handles finances for clients")),
    dict(job="architect", intro=["Our firm's design for the new public library just got approved by the council!",
                                 "Been redrawing floor plans for a client who keeps changing where the staircase goes."],
         q=["What profession is {P} in?", "What kind of projects does {P} work on professionally?"],
         open=("Would {P} appreciate a tour of famous modern buildings?", "likely; {subj} designs buildings")),
    dict(job="airline pilot", intro=["Flew to Denver and back twice today, the crosswinds on landing were no joke.",
                                     "Got my schedule for next month, mostly overnight routes across the Atlantic."],
         q=["What is {P}'s job?", "What does {P} operate at work?"],
         open=("Would {P} be nervous about turbulence on a flight?", "unlikely; {subj} flies planes for a living")),
    dict(job="librarian", intro=["We ran story hour at the branch today and thirty toddlers showed up, it was chaos.",
                                 "Spent my shift re-shelving returns and helping an old man print his boarding pass."],
         q=["Where does {P} work?", "What is {P}'s job?"],
         open=("Would {P} enjoy a gift card for a bookstore?", "likely; {subj} works with books all day")),
    dict(job="physiotherapist", intro=["Had six rehab patients back to back today, mostly knee replacements.",
                                       "One of my clients finally walked without her crutches after our sessions, I nearly cried."],
         q=["What does {P} do professionally?", "What kind of care does {P} provide at work?"],
         open=("Would {P} give good advice about a sore back?", "probably; {subj} treats injuries for a living")),
    dict(job="electrician", intro=["Rewired a whole kitchen today, the old wiring in that house was a fire hazard.",
                                   "Got called out to fix a breaker panel at a bakery at six in the morning."],
         q=["What trade does {P} work in?", "What is {P}'s job?"],
         open=("Could {P} probably install a ceiling fan?", "yes; {subj} does electrical work")),
    dict(job="journalist", intro=["My editor finally ran my piece on the city council budget, front page of the local section!",
                                  "Interviewed the mayor this afternoon and she dodged every question I had."],
         q=["What is {P}'s occupation?", "What does {P} produce for work?"],
         open=("Would {P} enjoy a documentary about investigative reporting?", "likely; {subj} writes news stories")),
    dict(job="veterinary technician", intro=["Held a very angry cat for twenty minutes at the clinic while we drew blood.",
                                             "We spayed six dogs at the animal hospital today, I'm wiped."],
         q=["What does {P} do for work?", "What kind of patients does {P} deal with at work?"],
         open=("Would {P} be a good person to ask about a sick pet?", "yes; {subj} works at a vet clinic")),
]
JOB_CHANGES = [
    ("I accepted an offer to run the training program at a {org}! Starting next month.", ("What new role did {P} take on?", "What offer did {P} accept?"),
     ["nonprofit", "community college", "startup", "regional hospital", "city council office"]),
    ("Big news, I handed in my notice. I'm going freelance as a consultant for a {org}.", ("What did {P} decide to do about {poss} career?", "Why did {P} hand in {poss} notice?"),
     ["design studio", "couple of small firms", "local charity", "family business"]),
    ("I got promoted! I'm now supervising the whole team at the {org}.", ("What advancement did {P} get at work?", "What promotion did {P} get?"),
     ["downtown branch", "main office", "north site", "new location"]),
]

PETS = [
    dict(animal="dog", young="puppy", kinds=["beagle", "corgi", "border collie", "dachshund", "labrador", "greyhound"],
         q=["canine", "dog", "four-legged companion"]),
    dict(animal="cat", young="kitten", kinds=["tabby", "Maine Coon", "Siamese", "ginger", "tuxedo"], q=["feline", "cat"]),
    dict(animal="rabbit", young="bunny", kinds=["lop-eared", "dwarf", "Rex"], q=["rabbit", "long-eared pet"]),
    dict(animal="parrot", young="parakeet", kinds=["green", "blue", "yellow-cheeked"], q=["bird", "feathered pet"]),
]
PET_NAMES = ["Biscuit", "Pepper", "Mochi", "Rufus", "Clementine", "Nacho", "Ziggy", "Olive", "Waffles", "Juniper",
             "Bean", "Pickles", "Luna", "Taco", "Noodle", "Maple", "Cosmo", "Peanut"]
PET_INTROS = [
    "Big news, we adopted a {kind} {young} from the shelter {rel}! We named {pobj} {pet}.",
    "Meet {pet}, my new {kind} {young}. Picked {pobj} up {rel} and {psubj} has already chewed a slipper.",
    "So I finally caved and brought home a little {kind} {young} {rel}. {pet} is asleep on my lap right now.",
]
PET_UPDATES = [
    ("{pet} had to go to the vet {rel}, {psubj} swallowed a sock. All fine now, thank goodness.",
     "Why did {P}'s {q} need medical attention?", "When did {P}'s {q} have a health scare?", "ate some laundry"),
    ("{pet} figured out how to open the pantry door and ate a whole bag of flour, the kitchen looked like it snowed.",
     "What mischief did {P}'s {q} get into?", None, "raided the food cupboard"),
    ("We took {pet} to the beach {rel} and {psubj} would not stop chasing the waves.",
     "Where did {P} take {poss} {q} on an outing?", "When did {P} go to the seaside with {poss} {q}?", "loves the surf"),
    ("{pet} learned to ring a little bell when {psubj} wants a treat, way too smart for {pposs} own good.",
     "What trick did {P}'s {q} pick up?", None, "signals for snacks"),
]
PET_OPEN = [("Would {P} probably want a holiday rental that allows animals?", "likely; {subj} has a {animal}"),
            ("Is {P} likely an animal lover?", "yes; {subj} adopted a {animal}")]

HOBBIES = [
    dict(word="pottery",
         intro="I signed up for a pottery class on Thursday evenings, my first bowl came out totally lopsided.",
         more=["Finally glazed the mug I made on the wheel, it's wonky but I love it.",
               "The kiln at the studio cracked two of my vases, I could scream."],
         q=["What creative workshop has {P} been attending?", "What does {P} shape with clay in {poss} spare time?"],
         open=["Would {P} enjoy a gift card for a ceramics studio?", "Does {P} enjoy crafts done with {poss} hands?"]),
    dict(word="bouldering",
         intro="I've been going to the bouldering gym three times a week, my forearms are destroyed.",
         more=["I finally sent a V4 problem at the gym! Took me a month of falling off.",
               "Ripped a callus on the crimps yesterday, taking a few rest days."],
         q=["What indoor sport has {P} been practising?", "What athletic milestone did {P} reach recently?"],
         open=["Would {P} be up for a trip to an outdoor rock crag?", "Is {P} someone who likes physical challenges?"]),
    dict(word="salsa",
         intro="My friend dragged me to a salsa night and now I'm hooked, I go every Wednesday.",
         more=["Our instructor said I'm ready for the intermediate group, I can finally do the cross-body lead.",
               "Wore my new heels to the Wednesday social and did not step on anyone's feet."],
         q=["What style of dance does {P} do?", "What weekly evening activity does {P} go to?"],
         open=["Would {P} enjoy a Latin music festival?", "Would {P} likely hit the floor at a wedding reception?"]),
    dict(word="watercolor",
         intro="I've been painting watercolor landscapes on Sunday mornings, it's weirdly calming.",
         more=["Sold my first little painting at the craft fair, a lake at sunset!",
               "Bought some fancy cotton paper and ruined three sheets already."],
         q=["What artistic medium does {P} work in?", "What did {P} manage to sell at a market?"],
         open=["Would {P} appreciate a set of professional brushes as a present?",
               "Would {P} enjoy an afternoon at an art gallery?"]),
    dict(word="sourdough",
         intro="I've been obsessed with baking sourdough, my starter is named Bubbles and lives on the fridge.",
         more=["My loaf finally had a proper open crumb this week, I took like forty photos of it.",
               "Fed Bubbles at midnight again, this thing runs my life."],
         q=["What kind of bread does {P} make at home?", "What did {P} give a name to in {poss} kitchen?"],
         open=["Would {P} enjoy a bakery tour in Paris?", "Would a Dutch oven be a good present for {P}?"]),
    dict(word="chess",
         intro="Joined a chess club at the library, lost all four games on Tuesday haha.",
         more=["Won my first rated game at the club! Checkmated a retired judge with a knight.",
               "Spent the evening studying openings, the Sicilian is melting my brain."],
         q=["What competitive board game group did {P} join?", "Whom did {P} beat, and with which piece?"],
         open=["Would {P} enjoy strategy puzzles?", "Would {P} like a book about famous grandmaster matches?"]),
    dict(word="woodworking",
         intro="Built a bookshelf out of oak in the garage this weekend, only one shelf is crooked.",
         more=["Bought a secondhand table saw, my garage is officially a workshop now.",
               "Making a cutting board for my mom's birthday, walnut and maple stripes."],
         q=["What piece of furniture did {P} make?", "What power tool did {P} purchase used?"],
         open=["Would {P} appreciate a gift of quality chisels?", "Does {P} like DIY projects around the house?"]),
    dict(word="knitting",
         intro="I'm knitting a scarf for my dad, the merino wool is so soft I want to keep it.",
         more=["Finished my first sweater! One sleeve is longer but nobody needs to know.",
               "Dropped a stitch twenty rows back and had to rip everything out."],
         q=["What is {P} making with yarn for {poss} father?", "What garment did {P} complete?"],
         open=["Would {P} enjoy a visit to a fibre and craft fair?", "Would {P} like a subscription box of yarn?"]),
    dict(word="running",
         intro="Training for a half marathon in the spring, did eighteen kilometres this morning before work.",
         more=["New personal best on my 10k loop, under fifty minutes!",
               "Shin splints again, my physio told me to cut the mileage."],
         q=["What race is {P} preparing for?", "What timing record did {P} set recently?"],
         open=["Would {P} appreciate a GPS sports watch?", "Is {P} likely an early riser?"]),
    dict(word="photography",
         intro="Bought a secondhand film camera and I've been shooting street photos downtown every weekend.",
         more=["Developed my first roll in the darkroom at the community center, half of it was blurry.",
               "One of my shots of the fish market got picked for a little exhibition!"],
         q=["What vintage gear did {P} buy for taking pictures?", "Which of {P}'s images was chosen for a show?"],
         open=["Would {P} enjoy a photo walk through an old town?", "Would {P} want a new lens as a birthday gift?"]),
    dict(word="gardening",
         intro="My tomatoes are finally ripening, the balcony garden is taking over the whole apartment.",
         more=["Planted garlic and some tulip bulbs for the spring, fingers crossed.",
               "Slugs ate every single one of my lettuces overnight."],
         q=["What is {P} growing at home?", "What pests ruined {P}'s crops?"],
         open=["Would {P} enjoy a trip to a botanical garden?", "Would {P} like a gift of heirloom seeds?"]),
    dict(word="guitar",
         intro="Started guitar lessons, my fingertips hurt so much from the steel strings.",
         more=["I can finally play a whole song without stopping, it's a Beatles one.",
               "My teacher wants me to learn barre chords and my hand keeps cramping."],
         q=["Which instrument is {P} learning?", "What can {P} now perform from start to finish?"],
         open=["Would {P} enjoy an open-mic night?", "Would {P} appreciate concert tickets for an acoustic act?"]),
    dict(word="birdwatching",
         intro="Got up at dawn to go birdwatching at the marsh and saw a heron catch a fish!",
         more=["Bought proper binoculars, now I can tell a sparrow from a finch.",
               "Spotted a kingfisher by the canal, my first one ever."],
         q=["What creature did {P} see hunting at the wetlands?", "What optical gear did {P} get?"],
         open=["Would {P} enjoy a weekend at a nature reserve?", "Is {P} a patient person outdoors?"]),
    dict(word="kayaking",
         intro="Rented a kayak and paddled around the lake for three hours, I'm sunburnt and happy.",
         more=["Capsized in the river rapids today, the instructor said it's a rite of passage.",
               "Thinking about buying my own boat, the rental fees add up."],
         q=["What water sport has {P} taken up?", "What happened to {P} on the fast-moving water?"],
         open=["Would {P} enjoy a canoe trip down a river?", "Is {P} comfortable on the water?"]),
    dict(word="astronomy",
         intro="Set up my new telescope on the roof last night and saw Saturn's rings, I actually gasped.",
         more=["Drove out past the city lights to see the meteor shower, counted thirty shooting stars.",
               "Trying to photograph the moon through the eyepiece with my phone, harder than it looks."],
         q=["Which planet has {P} observed?", "What did {P} count in the night sky?"],
         open=["Would {P} like a visit to a planetarium?", "Would {P} enjoy camping somewhere very dark?"]),
]

# How a question names a hobby without its own words.
HOBBY_KINDS = {"pottery": "clay workshop", "bouldering": "climbing sport", "salsa": "dance lessons",
               "watercolor": "painting pastime", "sourdough": "bread-making", "chess": "board game club",
               "woodworking": "carpentry projects", "knitting": "yarn craft", "running": "distance training",
               "photography": "camera pastime", "gardening": "growing plants", "guitar": "music lessons",
               "birdwatching": "wildlife spotting", "kayaking": "paddling", "astronomy": "stargazing"}

EVENTS = [
    dict(text="I went to see {band} live at the {venue} {rel}, my ears are still ringing.",
         qs="Which group did {P} watch perform?", qt="When did {P} attend a gig?",
         fill=dict(band=["The Lumineers", "Arctic Monkeys", "Florence and the Machine", "a local jazz trio", "Khruangbin"],
                   venue=["arena", "old theatre", "park stage", "warehouse club"])),
    dict(text="My cousin {cousin} got married {rel}, I danced until two in the morning.",
         qs="Whose wedding did {P} go to?", qt="When was the wedding in {P}'s family?",
         fill=dict(cousin=["Alicia", "Ben", "Tomas", "Grace", "Imani", "Pete"])),
    dict(text="Ran a charity 10k {rel} for the children's hospital, raised almost six hundred dollars!",
         qs="What cause did {P} raise money for?", qt="When did {P} take part in a fundraising race?", fill={}),
    dict(text="Was at the natural history museum {rel}, the dinosaur hall is enormous.",
         qs="What kind of exhibits did {P} go and see?", qt="When did {P} look at fossils?", fill={}),
    dict(text="Volunteered at the animal shelter {rel}, walked like nine dogs in the rain.",
         qs="Where did {P} help out for free?", qt="When did {P} help with rescued animals?", fill={}),
    dict(text="We went camping by the river {rel}, it rained the entire night and the tent leaked.",
         qs="What went wrong on {P}'s outdoor overnight trip?", qt="When did {P} sleep under canvas?", fill={}),
    dict(text="We moved into the new apartment {rel}, there are boxes everywhere and I can't find a single fork.",
         qs="What big change did {P} make to where {subj} lives?", qt="When did {P} relocate?", fill={}),
    dict(text="My car broke down on the highway {rel}, had to get towed and missed my meeting.",
         qs="What happened to {P}'s vehicle?", qt="When did {P} have trouble with {poss} vehicle?", fill={}),
    dict(text="Took a Thai cooking class {rel}, we made green curry completely from scratch.",
         qs="Which cuisine did {P} learn to prepare?", qt="When did {P} learn to make a Southeast Asian dish?", fill={}),
    dict(text="Ended up in the ER {rel}, I sprained my ankle playing volleyball.",
         qs="How did {P} get hurt?", qt="When did {P} injure a joint?", fill={}),
    dict(text="Saw a production of Hamlet at the community theatre {rel}, the ghost scene gave me chills.",
         qs="Which play did {P} watch?", qt="When did {P} see a Shakespeare tragedy on stage?", fill={}),
    dict(text="Gave a talk at a conference in {city} {rel}, I was so nervous my hands were shaking.",
         qs="Where did {P} present in front of an audience?", qt="When did {P} speak at a professional event?",
         fill=dict(city=["Chicago", "Toronto", "Berlin", "Austin", "Dublin"])),
    dict(text="Threw a surprise party for my best friend {rel}, {friend} had no idea and actually screamed.",
         qs="Whom did {P} organise a secret celebration for?", qt="When did {P} host a surprise celebration?",
         fill=dict(friend=["Sam", "Jess", "Andre", "Mina", "Luis"])),
    dict(text="Bought a used {car} {rel}, it has two hundred thousand kilometres on it but runs great.",
         qs="What vehicle did {P} purchase?", qt="When did {P} get a different car?",
         fill=dict(car=["Subaru Outback", "Honda Civic", "VW camper van", "Toyota pickup"])),
    dict(text="Went on a phone-free silent retreat {rel}, three days without saying a word.",
         qs="What kind of retreat did {P} go on?", qt="When did {P} spend days without speaking?", fill={}),
    dict(text="Got my wisdom teeth pulled {rel}, my face looks like a chipmunk.",
         qs="What dental procedure did {P} have?", qt="When did {P} have oral surgery?", fill={}),
]

TRIPS = [
    dict(city="Lisbon", country="Portugal", sight="the tiles on every building", food="custard tarts", adj="Portuguese"),
    dict(city="Kyoto", country="Japan", sight="the bamboo forest", food="matcha everything", adj="Japanese"),
    dict(city="Reykjavik", country="Iceland", sight="the geysers", food="hot dogs, weirdly", adj="Icelandic"),
    dict(city="Edinburgh", country="Scotland", sight="the castle on the hill", food="haggis, don't judge me", adj="Scottish"),
    dict(city="Mexico City", country="Mexico", sight="the pyramids at Teotihuacan", food="tacos al pastor", adj="Mexican"),
    dict(city="Marrakech", country="Morocco", sight="the souks", food="mint tea", adj="Moroccan"),
    dict(city="Vancouver", country="Canada", sight="Stanley Park", food="sushi", adj="Canadian"),
    dict(city="Prague", country="the Czech Republic", sight="the astronomical clock", food="dumplings", adj="Czech"),
    dict(city="Cape Town", country="South Africa", sight="Table Mountain", food="braai", adj="South African"),
    dict(city="Hanoi", country="Vietnam", sight="the Old Quarter", food="pho every morning", adj="Vietnamese"),
    dict(city="Buenos Aires", country="Argentina", sight="the tango halls", food="steak", adj="Argentinian"),
    dict(city="Istanbul", country="Turkey", sight="the Blue Mosque", food="baklava", adj="Turkish"),
]
TRIP_PLAN = ["I booked flights to {city} for {month}! Already making a list of things to see.",
             "Guess who's going to {city} in {month}? Me! Finally using my vacation days."]
TRIP_CHANGE = ["Change of plans, the {old} trip fell through because of the flights, so we're going to {city} instead.",
               "Ok so {old} is off, way too expensive, we switched to {city}. Honestly I'm more excited."]
TRIP_REPORT = ["Just got back from {city} {rel}! {sight} was unreal and I ate way too much {food}.",
               "Flew home {rel}. {city} was amazing, I'm still dreaming about {food}.",
               "Back from the trip {rel}, {sight} in {city} was the highlight. Jet lag is killing me."]
MONTHS = ["March", "April", "May", "June", "July", "August", "September", "October"]

RELATIVES = [("sister", "f"), ("brother", "m"), ("cousin", "f"), ("daughter", "f"), ("son", "m"), ("mom", "f"),
             ("dad", "m"), ("grandma", "f"), ("uncle", "m")]
RELATIVE_NAMES = {"f": ["Dana", "Beatriz", "Keiko", "Lottie", "Marisol", "June", "Esme", "Ruth"],
                  "m": ["Caleb", "Arjun", "Otto", "Reggie", "Tomasz", "Emeka", "Walt", "Hugo"]}
RELATIVE_INTROS = [
    "My {rel} {name} is staying with us this week, {rsubj}'s between apartments.",
    "Had dinner with my {rel} {name} {when}, {rsubj} says hi by the way.",
    "My {rel} {name} called me out of the blue {when}, we talked for two hours.",
]
RELATIVE_UPDATES = [
    ("{name} got into nursing school! I'm so proud.", "What did {P}'s {rel} get accepted to?"),
    ("{name} just got engaged, the ring is ridiculous.", "What big relationship news did {P}'s {rel} share?"),
    ("{name} is opening a tiny bakery downtown, the soft opening is next month.", "What business is {P}'s {rel} starting?"),
    ("{name} is moving to Berlin for work, I'm going to miss {robj} so much.", "Which city is {P}'s {rel} relocating to?"),
    ("{name} broke {rposs} wrist falling off a skateboard, at {rposs} age!", "What injury did {P}'s {rel} suffer?"),
    ("{name} adopted two goats. Goats. For the backyard.", "What unusual animals did {P}'s {rel} take in?"),
]

PREFERENCES = [
    dict(prompt="Want to come to the new steakhouse with us on Friday?",
         say="I'd love to hang out but I haven't eaten meat in about ten years, haha. Maybe somewhere else?",
         q="What are {P}'s eating habits?", open="Would {P} enjoy a barbecue ribs cook-off?", a="no; {subj} is vegetarian"),
    dict(prompt="My neighbour's cat had kittens, want one?",
         say="Oh I wish, but I'm badly allergic, my eyes swell shut around them.",
         q="What allergy does {P} have?", open="Would {P} be comfortable house-sitting for someone with a feline?",
         a="no; {subj} is allergic to cats"),
    dict(prompt="We're thinking of doing a skydive for my birthday!",
         say="Count me out, I get dizzy standing on a stepladder.",
         q="What is {P} afraid of?", open="Would {P} sign up for a hot-air balloon ride?", a="unlikely; {subj} fears heights"),
    dict(prompt="There's a slasher movie marathon at the old cinema next week.",
         say="Ooh, nothing beats a gory horror flick on a Friday night, I'm in.",
         q="What film genre does {P} love?", open="Would {P} enjoy a haunted house attraction at Halloween?",
         a="yes; {subj} loves horror"),
    dict(prompt="Do you ever sleep in on weekends?",
         say="Never, I'm up at five every single day, even on Sundays.",
         q="What are {P}'s sleep habits?", open="Would {P} struggle with a 6am flight?", a="no; {subj} wakes at five"),
    dict(prompt="The forecast says snow all week here.",
         say="Ugh, winter is the worst, I'm counting the days until I can wear shorts again.",
         q="Which season does {P} dislike?", open="Would {P} enjoy a ski holiday in the Alps?",
         a="probably not; {subj} hates the cold"),
    dict(prompt="Big party at Jess's place on Saturday, like fifty people!",
         say="Honestly crowds drain me, I'd rather have two friends over for board games.",
         q="How does {P} prefer to socialise?", open="Would {P} enjoy organising a huge festival?",
         a="no; {subj} prefers small gatherings"),
    dict(prompt="We're doing a boat cruise around the islands this summer.",
         say="Lucky you. I get seasick on a ferry that lasts twenty minutes.",
         q="What happens to {P} on boats?", open="Would {P} like a week-long ocean voyage?", a="no; {subj} gets seasick"),
    dict(prompt="I've been reading nothing but thrillers lately.",
         say="I'm the opposite, I only read science fiction, space operas especially.",
         q="What books does {P} like?", open="Would {P} enjoy a novel set on a distant planet?", a="yes; {subj} reads sci-fi"),
    dict(prompt="I'm trying to drink less coffee, it's hard.",
         say="Never! I roast my own beans and only do pour-over, it's basically a ritual.",
         q="How does {P} make {poss} morning drink?", open="Would {P} appreciate a hand grinder as a gift?",
         a="yes; {subj} is serious about coffee"),
]

# -- filler and reactions: the words of the conversation around the facts -----------------------------

GREETINGS = ["Hey {B}! How's your week going?", "Hi {B}, long time no chat!", "Morning {B}! Got a minute?",
             "Hey hey, it's been a while. How are things?", "{B}! You won't believe my week.",
             "Hi! Sorry I went quiet, life got busy.", "Hey {B}, you around?", "Happy Friday {B}!"]
GREETING_REPLIES = ["Hi {A}! Pretty good, busy but good. You?", "Hey! Tired, but hanging in there.",
                    "Oh hi {A}, I was just thinking about you!", "Always around for you. What's up?",
                    "Hey {A}! Ugh, Mondays. Tell me something fun.", "Hi! Doing fine, just made tea. What's new?"]
CLOSINGS = ["Anyway, I should get going. Talk soon!", "Gotta run, dinner's ready. Bye!",
            "Ok I need to sleep. Catch up next week?", "I have to head out, this was nice though.",
            "Alright, back to work for me. Later!", "My battery is dying, talk tomorrow?"]
CLOSING_REPLIES = ["Bye! Talk soon.", "Sounds good, take care {A}!", "Night!", "Later! Good luck with everything.",
                   "Yes, let's! Bye for now.", "Take care, talk soon!"]
REACTIONS = ["That's so cool!", "Haha, love that.", "Wow, good for you!", "Seriously? That's amazing!", "Oh nice!",
             "Oh no, that sounds rough.", "No way!", "Ha, classic you.", "That's wild.", "I'm so happy for you!"]
FOLLOW_UPS = [("How was it, honestly?", "Better than I expected, I'll send you some photos later."),
              ("Was it expensive?", "A bit, but totally worth it."),
              ("Tell me everything!", "Ha, not much more to tell, it was just a good time."),
              ("Who did you go with?", "Just me this time, I kind of liked that."),
              ("How are you feeling about it?", "Mostly good? Still processing, to be honest.")]
HOBBY_FOLLOW_UPS = [("How long have you been at it?", "Only a few weeks, but I'm completely hooked."),
                    ("Is it hard to learn?", "Harder than it looks, which is half the fun."),
                    ("Where do you even find the time?", "Honestly I just stopped scrolling my phone at night."),
                    ("Can I come along sometime?", "Yes! You'd love it, I'll send you the details.")]
SMALL_TALK = [
    ("It's been raining nonstop here, I haven't seen the sun in a week.", "Same here, my socks are permanently damp."),
    ("Did you catch the game last night?", "Only the last ten minutes, but what an ending."),
    ("I'm binge-watching a baking competition show, it's so wholesome.", "Which one? I need something new to watch."),
    ("Didn't sleep at all last night, the neighbours were having a party.", "Ugh, the worst. Earplugs, my friend."),
    ("Work is just... work, you know?", "Oh I know. Counting down to the weekend."),
    ("I'm trying to drink more water, day three and already failing.", "Haha, set reminders on your phone!"),
    ("My phone screen cracked this morning, classic Monday.", "Noo. Is it still usable at least?"),
    ("Traffic this morning was insane, took me an hour to go five kilometres.", "That's why I stopped driving downtown."),
    ("I made a huge pot of soup, I'll be eating it all week.", "Honestly that sounds like a great plan."),
    ("I cleaned the whole apartment today and feel like a new person.", "Teach me your ways, mine is a disaster."),
]
# Turns that reuse a fact's vocabulary without stating a fact about the asker: hard negatives.
ECHO = {
    "job": ["Ha, I could never do {job_word} work, I'd panic.", "I don't know how you do it, {A}, honestly."],
    "pet": ["A {kind} {young}! {pet} is such a cute name, I need pictures immediately.",
            "Aww, give {pet} a scratch behind the ears from me."],
    "pet_update": ["Oh no, poor {pet}! Glad {psubj}'s ok.", "Haha, {pet} sounds like a handful."],
    "hobby": ["I keep meaning to try {word} myself someday.", "You and your {word}, I love it.",
              "My coworker is really into {word} too, she never shuts up about it."],
    "event": ["Sounds like quite the weekend!", "Oh wow, I've always wanted to do something like that."],
    "trip_plan": ["{city}! I'm so jealous. You have to try the food there.", "Ooh, {city} in {month} sounds perfect."],
    "trip_change": ["Honestly {city} sounds better anyway.", "Aw, sorry about {old}, but {city} will be great."],
    "trip_report": ["Welcome home! I want to see every photo of {city}.", "Ugh, jet lag is the worst. Was {city} worth it?"],
    "relative": ["Say hi to {name} for me!", "Your {rel} sounds like a lot of fun."],
    "relative_update": ["Tell {name} congrats from me... or my sympathies, depending!", "Wow, {name} is full of surprises."],
    "job_change": ["That's huge, congratulations!", "Wait, really? Good for you, you deserved it."],
}
# Things the other person says about their own life in passing that share a topic's words.
LEAD_INS = ["Haha, true.", "Oh, speaking of which:", "Anyway!", "Ha, fair enough.", "Oh before I forget:",
            "So, news:", "Right?", "Ok so:", "Honestly same.", "Totally.", "Mm, yeah.", "Oh wait, I have to tell you."]
TAILS = ["How about you?", "Anyway, what's new with you?", "Have you ever done that?", "Crazy, right?",
         "I'll tell you more later.", "What have you been up to?", "Anyway, enough about me.", "Life, huh."]
# Sentences people add to any message; several reuse the catalogue's topics (pets, trips, work, family, hobbies).
ASIDES = ["Also it's been raining all day, so I'm stuck inside.", "My back is killing me from sitting all day.",
          "I still haven't unpacked from the weekend, by the way.", "Work has been a lot this week too.",
          "My mom keeps asking when we're visiting, so that's a whole thing.", "The dog next door won't stop barking.",
          "I really need a holiday somewhere warm.", "I've had way too much coffee today.",
          "Our group chat has been wild lately.", "I should really go to the gym more.",
          "We finally fixed the leaky tap, small victories.", "My cousin keeps sending me wedding plans to look at.",
          "I've been trying to cook more at home instead of ordering.", "Traffic downtown was a nightmare again.",
          "The kids at the park were so loud this morning.", "I've been meaning to call my grandma.",
          "My boss wants a report by Friday, ugh.", "I bought way too many plants again."]
PASSING = [
    "I went to a {word} workshop once, total disaster.", "My brother keeps sending me {word} videos at 2am.",
    "We drove through {city} on a road trip years ago, barely remember it.", "I used to have a {kind} {animal} growing up.",
    "My sister is a {job_word}, she says exactly the same thing.", "Someone at the gym was talking about {city} all morning.",
    "My neighbour has a {kind} {animal} too, it's cute but so loud.", "I thought about {word} once but never had the time.",
    "My aunt went to {city} last year and would not stop talking about it.", "We almost got a {young} last year but the landlord said no.",
    "I saw a poster for a {word} class at the community centre, might go.", "A friend of mine is a {job_word}, the hours sound brutal.",
]


# -- anchored phrasings: questions that reuse one telling word of the evidence (as real questions often do) ---------
# A question picks its anchored phrasing with probability ANCHOR_SHARE, else the paraphrased one.
ANCHOR_SHARE = 0.7
OPEN_ANCHOR_SHARE = 0.4  # inference questions name the topic less often than factual ones
ANCHORED_JOB = {
    "ICU nurse": "Which hospital unit does {P} work long shifts in?",
    "middle school science teacher": "Which subject and grade does {P} teach?",
    "software developer": "What does {P} work on at {poss} company, bugs and code reviews included?",
    "line cook": "Which station does {P} work at the restaurant?",
    "accountant": "Why has {P} been at the firm late every night?",
    "architect": "What kind of work does {P}'s firm do, judging by the plans and designs?",
    "airline pilot": "What does {P} do on those routes and landings?",
    "librarian": "At what kind of branch does {P} work shifts?",
    "physiotherapist": "What kind of patients does {P} see for rehab?",
    "electrician": "What wiring and breaker work does {P} do?",
    "journalist": "What does {P}'s editor publish?",
    "veterinary technician": "What does {P} do at the clinic?",
}
ANCHORED_PET_UPDATE = {
    "ate some laundry": ("What did {P}'s pet swallow before the vet visit?", "When did {P} take {poss} pet to the vet?"),
    "raided the food cupboard": ("What did {P}'s pet eat after opening the pantry?", None),
    "loves the surf": ("What did {P}'s pet chase at the beach?", "When did {P} take {poss} pet to the beach?"),
    "signals for snacks": ("What does {P}'s pet ring when it wants a treat?", None),
}
ANCHORED_HOBBY = {
    "pottery": ("What did {P} make at {poss} first pottery class?", "What did {P} glaze?"),
    "bouldering": ("How often does {P} go to the bouldering gym?", "What problem did {P} finally send at the gym?"),
    "salsa": ("How often does {P} go to salsa night?", "Which group did {P}'s salsa instructor move {obj} to?"),
    "watercolor": ("What does {P} paint in watercolor?", "What painting did {P} sell at the craft fair?"),
    "sourdough": ("What is {P}'s sourdough starter called?", "What did {P}'s loaf finally have?"),
    "chess": ("Where did {P} join a chess club?", "Who did {P} checkmate at the club?"),
    "woodworking": ("What did {P} build in the garage?", "What secondhand saw did {P} buy?"),
    "knitting": ("Who is {P} knitting a scarf for?", "What did {P} finish knitting?"),
    "running": ("How far did {P} run while training for the half marathon?", "What personal best did {P} set on the 10k?"),
    "photography": ("What camera does {P} shoot street photos with?", "Where did {P} develop {poss} first roll?"),
    "gardening": ("What is ripening in {P}'s balcony garden?", "What did {P} plant for the spring?"),
    "guitar": ("Why do {P}'s fingertips hurt?", "What song can {P} finally play?"),
    "birdwatching": ("What did {P} see at the marsh?", "Why did {P} buy binoculars?"),
    "kayaking": ("Where did {P} paddle a kayak?", "What happened to {P} in the river rapids?"),
    "astronomy": ("What did {P} see through {poss} new telescope?", "What did {P} drive out past the city lights to see?"),
}
ANCHORED_EVENT = {  # by the event's first words: (single-hop, temporal)
    "I went to see": ("Which band did {P} see live?", "When did {P} see a band live?"),
    "My cousin": ("Which cousin of {P}'s got married?", "When did {P}'s cousin get married?"),
    "Ran a charity": ("What did {P} run a charity 10k for?", "When did {P} run the charity 10k?"),
    "Was at the natural": ("Which hall impressed {P} at the museum?", "When did {P} visit the natural history museum?"),
    "Volunteered at": ("What did {P} do at the animal shelter?", "When did {P} volunteer at the shelter?"),
    "We went camping": ("What happened to {P}'s tent while camping?", "When did {P} go camping?"),
    "We moved into": ("What can't {P} find after the move?", "When did {P} move into the new apartment?"),
    "My car broke": ("Why did {P}'s car have to be towed?", "When did {P}'s car break down?"),
    "Took a Thai": ("What did {P} make in the Thai cooking class?", "When did {P} take the cooking class?"),
    "Ended up in": ("How did {P} sprain an ankle?", "When did {P} end up in the ER?"),
    "Saw a production": ("Which scene of Hamlet gave {P} chills?", "When did {P} see Hamlet?"),
    "Gave a talk": ("Where did {P} give a conference talk?", "When did {P} give a talk at a conference?"),
    "Threw a surprise": ("Who did {P} throw a surprise party for?", "When did {P} throw the surprise party?"),
    "Bought a used": ("What used car did {P} buy?", "When did {P} buy a used car?"),
    "Went on a phone-free": ("How long was {P}'s silent retreat?", "When did {P} go on a silent retreat?"),
    "Got my wisdom": ("What did {P} have pulled?", "When did {P} get {poss} wisdom teeth out?"),
}
ANCHORED_PREFERENCE = [
    "Why won't {P} go to the steakhouse?", "Why can't {P} take one of the kittens?", "Why won't {P} skydive?",
    "What does {P} think of slasher movies?", "Does {P} sleep in on weekends?", "How does {P} feel about winter?",
    "Why would {P} skip a big party?", "Why would {P} avoid a boat cruise?", "What does {P} read instead of thrillers?",
    "How does {P} take {poss} coffee?",
]


def phrase(rng: random.Random, paraphrased: str, anchored: str | None, share: float = ANCHOR_SHARE) -> str:
    return anchored if anchored and rng.random() < share else paraphrased


# -- relative times -------------------------------------------------------------------------------------


RELATIVE_PHRASES = [("yesterday", "day"), ("last weekend", "day"), ("last Friday", "day"), ("this morning", "day"),
                    ("a few days ago", "about"), ("last week", "week"), ("on Saturday", "day"), ("two weeks ago", "week")]


def relative_time(rng: random.Random) -> tuple[str, str]:
    """A phrase such as "last weekend" and how precise the day it points to is (see `resolve`)."""
    return rng.choice(RELATIVE_PHRASES)


def when_answer(moment: date, precision: str) -> str:
    if precision == "day":
        return moment.isoformat()
    if precision == "about":
        return f"around {moment.isoformat()}"
    return f"the week of {moment.isoformat()}"


# -- the builder ----------------------------------------------------------------------------------------


@dataclass
class Person:
    name: str
    gender: str
    other: str = ""

    def fill(self, template: str, **extra: Any) -> str:
        pronouns = PRONOUNS[self.gender]
        return template.format(**{"P": self.name, "A": self.name, "B": self.other, **pronouns, **extra})


@dataclass
class Episode:
    """Turns to place in one session (said by `speaker` and the other person), plus questions about them."""

    speaker: int
    lines: list[tuple[int, str, str | None]]  # (who: 0 = speaker, 1 = other), text, tag naming the turn
    after: str | None = None  # tag of an earlier episode this one must follow
    tag: str | None = None


@dataclass
class Conversation:
    rng: random.Random
    conv_id: str
    people: list[Person]
    start: date
    episodes: list[Episode] = field(default_factory=list)
    # question drafts: (kind, person index, text, [tags], answer)
    drafts: list[tuple[str, int, str, list[str], str]] = field(default_factory=list)
    dated: dict[str, tuple[str, str]] = field(default_factory=dict)  # tag -> (relative phrase, precision)


def build_conversation(seed: int, index: int, sessions: int | None = None) -> dict[str, Any]:
    rng = random.Random(seed * 1000 + index)
    (a_name, a_gender), (b_name, b_gender) = rng.sample(NAMES, 2)
    people = [Person(a_name, a_gender, b_name), Person(b_name, b_gender, a_name)]
    n_sessions = sessions or rng.randint(20, 30)
    start = date(2023, 1, 9) + timedelta(days=rng.randint(0, 300))
    conv = Conversation(rng, f"conv-{index + 1:02d}", people, start)
    jobs = rng.sample(JOBS, 2)
    pets = rng.sample(PETS, 2)
    hobbies = rng.sample(HOBBIES, 6)
    trips = rng.sample(TRIPS, 8)
    prefs = rng.sample(PREFERENCES, 6)
    events = rng.sample(EVENTS, 10)
    relatives = rng.sample(RELATIVES, 4)
    relative_names = {"f": rng.sample(RELATIVE_NAMES["f"], 4), "m": rng.sample(RELATIVE_NAMES["m"], 4)}
    pet_names = rng.sample(PET_NAMES, 2)
    for who in (0, 1):
        add_job(conv, who, jobs[who])
        add_pet(conv, who, pets[who], pet_names[who])
        add_hobbies(conv, who, hobbies[who * 3:who * 3 + 3])
        add_trips(conv, who, trips[who * 4:who * 4 + 4])
        for pref in prefs[who * 3:who * 3 + 3]:
            add_preference(conv, who, pref)
        add_events(conv, who, events[who * 5:who * 5 + 5])
        for rel in relatives[who * 2:who * 2 + 2]:
            add_relative(conv, who, rel, relative_names[rel[1]].pop())
    add_cross_questions(conv)
    sessions_out = place_episodes(conv, n_sessions)
    questions = finish_questions(conv, sessions_out)
    return {"conversation_id": conv.conv_id, "speakers": [p.name for p in people], "sessions": sessions_out,
            "questions": questions}


def _person_words(conv: Conversation, who: int) -> Person:
    return conv.people[who]


def add_job(conv: Conversation, who: int, job: dict[str, Any]) -> None:
    rng, person = conv.rng, conv.people[who]
    tag = f"job-{who}"
    lines = [(0, rng.choice(job["intro"]), tag), (1, rng.choice(ECHO["job"]).format(job_word=job["job"].split()[-1], A=person.name), None)]
    if rng.random() < 0.5:
        lines.append((0, rng.choice(["Thanks, it has its moments.", "Some days I love it, some days less so.",
                                     "Ha, you get used to it. Mostly."]), None))
    conv.episodes.append(Episode(who, lines, tag=tag))
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, rng.choice(job["q"]), ANCHORED_JOB[job["job"]])), [tag], job["job"]))
    question, answer = job["open"]
    conv.drafts.append(("open-domain", who, person.fill(question), [tag], person.fill(answer)))
    # a second mention of the job in another session, so the multi-hop "job before and after" has two sides
    second = f"job2-{who}"
    other_intro = [t for t in job["intro"] if t != lines[0][1]][0]
    conv.episodes.append(Episode(who, [(0, other_intro, second), (1, rng.choice(REACTIONS), None)], tag=second, after=tag))
    if rng.random() < 0.7:
        text, q, orgs = rng.choice(JOB_CHANGES)
        change = f"jobchange-{who}"
        conv.episodes.append(Episode(who, [(0, person.fill(text, org=rng.choice(orgs)), change),
                                           (1, rng.choice(ECHO["job_change"]), None)], tag=change, after=second))
        conv.drafts.append(("single-hop", who, person.fill(phrase(rng, *q)), [change], "see the evidence turn"))
        conv.drafts.append(("multi-hop", who, person.fill(phrase(rng,
            rng.choice(["What did {P} do for work before the recent change, and what changed?",
                        "How has {P}'s working life developed over these months?"]),
            "What was {P}'s job before the big news about " + ("the offer" if "offer" in text else "the notice" if "notice" in text else "the promotion") + "?")), [tag, change],
            f"{job['job']}, then the change"))
        conv.drafts.append(("temporal", who, person.fill("Around when did {P} announce news about {poss} career?"),
                            [change], "session:" + change))


def add_pet(conv: Conversation, who: int, pet: dict[str, Any], pet_name: str) -> None:
    rng, person = conv.rng, conv.people[who]
    kind = rng.choice(pet["kinds"])
    pp = PRONOUNS[rng.choice("fm")]
    slots = dict(kind=kind, young=pet["young"], pet=pet_name, psubj=pp["subj"], pobj=pp["obj"], pposs=pp["poss"],
                 animal=pet["animal"])
    tag = f"pet-{who}"
    intro = rng.choice(PET_INTROS)
    rel, precision = relative_time(rng)
    conv.dated[tag] = (rel, precision)
    text = intro.format(rel=rel, **slots)
    text = text[0].upper() + text[1:]
    conv.episodes.append(Episode(who, [(0, text, tag), (1, rng.choice(ECHO["pet"]).format(**slots), None)], tag=tag))
    q = rng.choice(pet["q"])
    young = pet["young"]
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, rng.choice([
        "What is the name of the animal {P} brought home?", "What did {P} call {poss} new " + q + "?"]),
        "What is the name of {P}'s " + young + "?")), [tag], pet_name))
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, "What breed or colour is {P}'s " + q + "?",
                                                           "What breed is the " + young + " {P} adopted?")), [tag], kind))
    conv.drafts.append(("temporal", who, person.fill(phrase(rng, rng.choice([
        "When did {P} welcome a " + q + " into {poss} home?", "When did {P} take in a " + q + "?"]),
        "When did {P} bring home {poss} " + young + "?")), [tag], "date:" + tag))
    question, answer = rng.choice(PET_OPEN)
    question = phrase(rng, question, "Would {P} look for a holiday rental where " + pet_name + " is allowed?", OPEN_ANCHOR_SHARE)
    conv.drafts.append(("open-domain", who, person.fill(question), [tag], person.fill(answer, animal=pet["animal"])))
    previous = tag
    updates = []
    for number, (update, qs, qt, description) in enumerate(rng.sample(PET_UPDATES, 2)):
        utag = f"petupd{number}-{who}"
        updates.append(utag)
        rel2, precision2 = relative_time(rng)
        if "{rel}" in update:
            conv.dated[utag] = (rel2, precision2)
        text = update.format(rel=rel2, **slots)
        lines = [(0, text, utag), (1, rng.choice(ECHO["pet_update"]).format(**slots), None)]
        conv.episodes.append(Episode(who, lines, tag=utag, after=previous))
        previous = utag
        anchored_single, anchored_when = ANCHORED_PET_UPDATE[description]
        conv.drafts.append(("single-hop", who, person.fill(phrase(rng, qs, anchored_single), q=q), [utag], "see the evidence turn"))
        if qt and "{rel}" in update:
            conv.drafts.append(("temporal", who, person.fill(phrase(rng, qt, anchored_when), q=q), [utag], "date:" + utag))
        # the update names the pet but not the animal: the breed comes from the adoption turn
        conv.drafts.append(("multi-hop", who, person.fill(phrase(rng, rng.choice([
            "What breed or colour is {P}'s animal that " + description + "?",
            "The pet of {P}'s that " + description + ": what kind of creature is it?"]),
            "What breed is " + pet_name + ", the pet that " + description + "?")), [tag, utag], kind))
    conv.drafts.append(("multi-hop", who, person.fill(rng.choice([
        "What has happened with {P}'s " + q + " since {subj} took it in?",
        "What stories has {P} shared about {poss} " + q + " over the months?"])), [tag, *updates], "see the evidence turns"))


def add_hobbies(conv: Conversation, who: int, hobbies: list[dict[str, Any]]) -> None:
    rng, person = conv.rng, conv.people[who]
    tags = []
    for number, hobby in enumerate(hobbies):
        tag = f"hobby{number}-{who}"
        tags.append(tag)
        lines = [(0, hobby["intro"], tag), (1, rng.choice(ECHO["hobby"]).format(word=hobby["word"]), None)]
        if rng.random() < 0.5:
            ask, answer = rng.choice(HOBBY_FOLLOW_UPS)
            lines += [(1, ask, None), (0, answer, None)]
        conv.episodes.append(Episode(who, lines, tag=tag))
        conv.drafts.append(("single-hop", who, person.fill(phrase(rng, hobby["q"][0], ANCHORED_HOBBY[hobby["word"]][0])), [tag],
                            hobby["word"]))
        more = hobby["more"]
        previous = tag
        more_tags = []
        for step, text in enumerate(more):
            mtag = f"hobby{number}m{step}-{who}"
            more_tags.append(mtag)
            conv.episodes.append(Episode(who, [(0, text, mtag), (1, rng.choice(REACTIONS + ECHO["hobby"]).format(word=hobby["word"]), None)],
                                         tag=mtag, after=previous))
            previous = mtag
        conv.drafts.append(("single-hop", who, person.fill(phrase(rng, hobby["q"][1], ANCHORED_HOBBY[hobby["word"]][1])),
                            [more_tags[0]], "see the evidence turn"))
        conv.drafts.append(("temporal", who, person.fill(rng.choice([
            "When did {P} start {poss} " + HOBBY_KINDS[hobby["word"]] + "?",
            "Around what date did {P} say {subj} had taken up " + HOBBY_KINDS[hobby["word"]] + "?"])), [tag],
            "session:" + tag))
        anchored_open = ["Would {P} enjoy a weekend retreat all about " + hobby["word"] + "?",
                         "Would a book about " + hobby["word"] + " make a good present for {P}?"]
        for question, anchored in zip(hobby["open"], anchored_open):
            conv.drafts.append(("open-domain", who, person.fill(phrase(rng, question, anchored, OPEN_ANCHOR_SHARE)),
                                [tag, *more_tags[:1]], "yes, from the hobby"))
        conv.drafts.append(("multi-hop", who, person.fill(rng.choice([
            "How has {P}'s " + hobby["word"] + " been going since {subj} started?",
            "What progress and setbacks has {P} had with {poss} " + hobby["word"] + " over time?"])),
            [tag, *more_tags], hobby["word"]))
    conv.drafts.append(("multi-hop", who, person.fill(rng.choice([
        "Which pastimes has {P} picked up during these months?", "What does {P} do for fun in {poss} free time?",
        "List the leisure activities {P} has talked about."])), tags, ", ".join(h["word"] for h in hobbies)))
    conv.drafts.append(("open-domain", who, person.fill(rng.choice([
        "What would make a thoughtful birthday present for {P}?", "What sort of weekend workshop would {P} sign up for?"])),
        tags, "something related to " + ", ".join(h["word"] for h in hobbies)))


def add_trips(conv: Conversation, who: int, trips: list[dict[str, Any]]) -> None:
    rng, person = conv.rng, conv.people[who]
    reports = []
    # trip 0: planned, then reported; trip 1: planned, changed to trip 2, then reported; trip 3 only mentioned later
    plan0, report0 = f"trip0plan-{who}", f"trip0-{who}"
    month = rng.choice(MONTHS)
    t = trips[0]
    conv.episodes.append(Episode(who, [(0, rng.choice(TRIP_PLAN).format(city=t["city"], month=month), plan0),
                                       (1, rng.choice(ECHO["trip_plan"]).format(city=t["city"], month=month), None)], tag=plan0))
    add_trip_report(conv, who, t, report0, after=plan0)
    reports.append(report0)
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, rng.choice([
        "Which country did {P} visit on {poss} holiday?", "Where abroad did {P} travel?"]),
        "What did {P} love about " + t["city"] + "?")), [report0], t["country"]))
    conv.drafts.append(("temporal", who, person.fill(phrase(rng, rng.choice([
        "When did {P} return from {poss} " + t["adj"] + " getaway?",
        "When did {P} come home from abroad after the " + t["adj"] + " holiday?"]),
        "When did {P} get back from " + t["city"] + "?")), [report0], "date:" + report0))
    conv.drafts.append(("open-domain", who, person.fill("Would {P} be able to recommend local dishes in " + t["country"] + "?"),
                        [report0], "yes; {P} has been there".replace("{P}", person.name)))
    old, new = trips[1], trips[2]
    plan1, change1, report1 = f"trip1plan-{who}", f"trip1change-{who}", f"trip1-{who}"
    month = rng.choice(MONTHS)
    conv.episodes.append(Episode(who, [(0, rng.choice(TRIP_PLAN).format(city=old["city"], month=month), plan1),
                                       (1, rng.choice(ECHO["trip_plan"]).format(city=old["city"], month=month), None)], tag=plan1))
    conv.episodes.append(Episode(who, [(0, rng.choice(TRIP_CHANGE).format(old=old["city"], city=new["city"]), change1),
                                       (1, rng.choice(ECHO["trip_change"]).format(old=old["city"], city=new["city"]), None)],
                                 tag=change1, after=plan1))
    add_trip_report(conv, who, new, report1, after=change1)
    reports.append(report1)
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, rng.choice([
        "Where did {P} end up going instead of the original destination?",
        "What destination did {P} switch to after the first plan was cancelled?"]),
        "Which city did {P} pick after the " + old["city"] + " trip was off?")), [change1], new["city"]))
    conv.drafts.append(("multi-hop", who, person.fill(phrase(rng, rng.choice([
        "How did {P}'s vacation plans change, and why?", "What was {P}'s first travel idea and what replaced it?"]),
        "Why did {P} swap " + old["city"] + " for another trip, and when was the first one booked for?")),
        [plan1, change1], f"{old['city']} -> {new['city']}"))
    conv.drafts.append(("multi-hop", who, person.fill(phrase(rng, rng.choice([
        "Which foreign places has {P} been to during these months?", "List every country {P} went to."]),
        "Which trips did {P} get back from, and what was the highlight of each?")),
        reports, ", ".join(x["country"] for x in (trips[0], new))))
    conv.drafts.append(("temporal", who, person.fill(phrase(rng, "In which month did {P} originally intend to fly to " + old["country"] + "?",
                                                         "For which month had {P} booked flights to " + old["city"] + "?")),
                        [plan1], month))


def add_trip_report(conv: Conversation, who: int, trip: dict[str, Any], tag: str, after: str) -> None:
    rng = conv.rng
    rel, precision = relative_time(rng)
    conv.dated[tag] = (rel, precision)
    text = rng.choice(TRIP_REPORT).format(rel=rel, **trip)
    text = text[0].upper() + text[1:]
    lines = [(0, text, tag), (1, rng.choice(ECHO["trip_report"]).format(**trip), None)]
    if rng.random() < 0.6:
        ask, answer = rng.choice(FOLLOW_UPS)
        lines += [(1, ask, None), (0, answer, None)]
    conv.episodes.append(Episode(who, lines, tag=tag, after=after))


def add_preference(conv: Conversation, who: int, pref: dict[str, Any]) -> None:
    rng, person = conv.rng, conv.people[who]
    tag = f"pref{PREFERENCES.index(pref)}-{who}"
    conv.episodes.append(Episode(who, [(1, pref["prompt"], None), (0, pref["say"], tag),
                                       (1, rng.choice(["Fair enough!", "Ha, noted.", "Oh right, I forgot!", "Totally get it."]), None)],
                                 tag=tag))
    anchored = ANCHORED_PREFERENCE[PREFERENCES.index(pref)]
    conv.drafts.append(("single-hop", who, person.fill(phrase(rng, pref["q"], anchored)), [tag], person.fill(pref["a"])))
    conv.drafts.append(("open-domain", who, person.fill(pref["open"]), [tag], person.fill(pref["a"])))


def add_events(conv: Conversation, who: int, events: list[dict[str, Any]]) -> None:
    rng, person = conv.rng, conv.people[who]
    for number, event in enumerate(events):
        tag = f"event{number}-{who}"
        rel, precision = relative_time(rng)
        conv.dated[tag] = (rel, precision)
        slots = {k: rng.choice(v) for k, v in event["fill"].items()}
        text = event["text"].format(rel=rel, **slots)
        lines = [(0, text, tag), (1, rng.choice(REACTIONS + ECHO["event"]), None)]
        if rng.random() < 0.6:
            ask, answer = rng.choice(FOLLOW_UPS)
            lines += [(1, ask, None), (0, answer, None)]
        conv.episodes.append(Episode(who, lines, tag=tag))
        anchored = next(v for k, v in ANCHORED_EVENT.items() if event["text"].startswith(k))
        conv.drafts.append(("single-hop", who, person.fill(phrase(rng, event["qs"], anchored[0])), [tag], "see the evidence turn"))
        conv.drafts.append(("temporal", who, person.fill(phrase(rng, event["qt"], anchored[1])), [tag], "date:" + tag))


def add_relative(conv: Conversation, who: int, relative: tuple[str, str], name: str) -> None:
    rng, person = conv.rng, conv.people[who]
    rel, gender = relative
    rp = PRONOUNS[gender]
    slots = dict(rel=rel, name=name, rsubj=rp["subj"], robj=rp["obj"], rposs=rp["poss"])
    tag = f"rel-{rel}-{who}"
    when, precision = relative_time(rng)
    conv.dated[tag] = (when, precision)
    conv.episodes.append(Episode(who, [(0, rng.choice(RELATIVE_INTROS).format(when=when, **slots), tag),
                                       (1, rng.choice(ECHO["relative"]).format(**slots), None)], tag=tag))
    conv.drafts.append(("single-hop", who, person.fill("What is the name of {P}'s " + rel + "?"), [tag], name))
    update, q = rng.choice(RELATIVE_UPDATES)
    utag = f"relupd-{rel}-{who}"
    conv.episodes.append(Episode(who, [(0, update.format(**slots), utag), (1, rng.choice(ECHO["relative_update"]).format(**slots), None)],
                                 tag=utag, after=tag))
    # the update names the relative without saying how they are related: two turns are needed
    conv.drafts.append(("multi-hop", who, person.fill(phrase(rng, q.replace("{rel}", rel), "What news did {P} share about " + name + "?")),
                        [tag, utag], "see the evidence turns"))
    if "staying with us" not in conv.episodes[-2].lines[0][1]:
        conv.drafts.append(("temporal", who, person.fill(phrase(rng, "When did {P} last catch up with {poss} " + rel + "?",
                                                             "When did {P} talk with " + name + "?")), [tag],
                            "date:" + tag))


def add_cross_questions(conv: Conversation) -> None:
    """Questions about both people at once: their evidence is in both people's turns."""
    a, b = conv.people
    conv.drafts.append(("multi-hop", 0, f"Do {a.name} and {b.name} both have pets, and what kinds?", ["pet-0", "pet-1"], "both"))
    conv.drafts.append(("multi-hop", 0, f"What do {a.name} and {b.name} each do for a living?", ["job-0", "job-1"], "both jobs"))
    conv.drafts.append(("multi-hop", 0, f"Which destinations did {a.name} and {b.name} come back from?",
                        ["trip0-0", "trip0-1", "trip1-0", "trip1-1"], "all trips"))


# -- placing episodes into dated sessions ------------------------------------------------------------------


def place_episodes(conv: Conversation, n_sessions: int) -> list[dict[str, Any]]:
    rng = conv.rng
    episodes = list(conv.episodes)
    rng.shuffle(episodes)
    by_tag = {e.tag: e for e in episodes if e.tag}
    session_of: dict[str, int] = {}
    slots: list[list[Episode]] = [[] for _ in range(n_sessions)]
    # an episode that follows another goes to a later session; chains are placed root first
    def depth(e: Episode) -> int:
        return 0 if e.after is None else 1 + depth(by_tag[e.after])

    for episode in sorted(episodes, key=depth):
        earliest = 0 if episode.after is None else session_of[episode.after] + 1
        earliest = min(earliest, n_sessions - 1)
        latest = n_sessions - 1 if episode.after is None else min(n_sessions - 1, earliest + max(2, n_sessions // 3))
        if episode.after is None and any(e.after == episode.tag for e in episodes):
            latest = max(0, n_sessions * 2 // 3)  # leave room for what follows
        candidates = list(range(earliest, latest + 1))
        target = min(candidates, key=lambda s: (len(slots[s]) + rng.random() * 2.5))
        slots[target].append(episode)
        if episode.tag:
            session_of[episode.tag] = target
    day = conv.start
    sessions: list[dict[str, Any]] = []
    for number, content in enumerate(slots, start=1):
        if number > 1:
            day += timedelta(days=rng.choice([3, 4, 5, 6, 7, 8, 10, 12, 14, 17, 21]))
        rng.shuffle(content)
        content.sort(key=depth)
        opener = rng.randrange(2)
        a, b = conv.people[opener], conv.people[1 - opener]
        turns: list[tuple[str, str, str | None]] = [
            (a.name, a.fill(rng.choice(GREETINGS)), None), (b.name, b.fill(rng.choice(GREETING_REPLIES), A=a.name), None)]
        chat = rng.sample(SMALL_TALK, len(SMALL_TALK))
        for episode in content:
            speaker, other = conv.people[episode.speaker], conv.people[1 - episode.speaker]
            for who, text, tag in episode.lines:
                turns.append(((speaker if who == 0 else other).name, text, tag))
            if rng.random() < 0.6 and chat:
                small, reply = chat.pop()
                first = rng.randrange(2)
                turns += [(conv.people[first].name, small, None), (conv.people[1 - first].name, reply, None)]
            if rng.random() < 0.5:
                passing_speaker = other
                turns.append((passing_speaker.name, passing_line(conv), None))
        while len(turns) < 13 and chat:
            small, reply = chat.pop()
            turns += [(a.name, small, None), (b.name, reply, None)]
        closer = rng.randrange(2)
        turns += [(conv.people[closer].name, rng.choice(CLOSINGS), None),
                  (conv.people[1 - closer].name, conv.people[1 - closer].fill(rng.choice(CLOSING_REPLIES), A=conv.people[closer].name), None)]
        session = {"session": number, "date": day.isoformat(), "turns": []}
        for t_number, (speaker_name, text, tags) in enumerate(chat_turns(rng, turns), start=1):
            turn = {"key": f"s{number:02d}-t{t_number:02d}", "speaker": speaker_name, "text": text, "date": day.isoformat()}
            if tags:
                turn["tags"] = tags
            session["turns"].append(turn)
        sessions.append(session)
    return sessions


def chat_turns(rng: random.Random, lines: list[tuple[str, str, str | None]]) -> list[tuple[str, str, list[str]]]:
    """Pad fact lines with chat around them and merge a speaker's consecutive lines into one turn, as people
    write: a reaction, the news, a question back. A fact then shares its turn with words about other things."""
    turns: list[tuple[str, str, list[str]]] = []
    for speaker, text, tag in lines:
        if tag:
            if rng.random() < 0.45:
                text = f"{rng.choice(LEAD_INS)} {text}"
            if rng.random() < 0.4:
                text = f"{text} {rng.choice(TAILS)}"
        if rng.random() < 0.3:
            text = f"{text} {rng.choice(ASIDES)}" if rng.random() < 0.5 else f"{rng.choice(ASIDES)} {text}"
        if turns and turns[-1][0] == speaker:
            previous_speaker, previous_text, previous_tags = turns[-1]
            turns[-1] = (speaker, f"{previous_text} {text}", previous_tags + ([tag] if tag else []))
        else:
            turns.append((speaker, text, [tag] if tag else []))
    return turns


def passing_line(conv: Conversation) -> str:
    rng = conv.rng
    pet = rng.choice(PETS)
    return rng.choice(PASSING).format(kind=rng.choice(pet["kinds"]), young=pet["young"], animal=pet["animal"], word=rng.choice(HOBBIES)["word"],
                                      city=rng.choice(TRIPS)["city"], job_word=rng.choice(JOBS)["job"])


def finish_questions(conv: Conversation, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rng = conv.rng
    where: dict[str, dict[str, Any]] = {}
    for session in sessions:
        for turn in session["turns"]:
            for tag in turn.get("tags", []):
                where[tag] = turn
    # now that each dated turn has its session's date, fix the dated turns' text-relative day
    pool: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for kind, who, text, tags, answer in conv.drafts:
        if any(tag not in where for tag in tags):
            continue
        if answer.startswith("date:"):
            tag = answer[5:]
            rel, precision = conv.dated[tag]
            answer = when_answer(resolve(rel, date.fromisoformat(where[tag]["date"])), precision)
        elif answer.startswith("session:"):
            answer = f"in the conversation of {where[answer[8:]]['date']}"
        evidence = sorted({where[tag]["key"] for tag in tags})
        pool[kind].append({"question": text, "kind": kind, "person": conv.people[who].name, "evidence": evidence,
                           "answer": answer})
    total = rng.randint(140, 175)
    wanted = {k: round(total * KIND_SHARE[k]) for k in KINDS}
    chosen: list[dict[str, Any]] = []
    for kind in KINDS:
        items = pool[kind]
        rng.shuffle(items)
        chosen += items[:wanted[kind]]
    rng.shuffle(chosen)
    for number, question in enumerate(chosen, start=1):
        question["id"] = f"{conv.conv_id}-q{number:03d}"
    return [{"id": q["id"], **{k: v for k, v in q.items() if k != "id"}} for q in chosen]


def resolve(rel: str, day: date) -> date:
    """The day `rel` ("yesterday", "last weekend", ...) points to from a session held on `day`."""
    if rel == "yesterday" or rel in ("last night",):
        return day - timedelta(days=1)
    if rel == "this morning":
        return day
    if rel in ("last weekend", "on Saturday"):
        return day - timedelta(days=(day.weekday() - 5) % 7 or 7)
    if rel == "last Friday":
        return day - timedelta(days=(day.weekday() - 4) % 7 or 7)
    if rel == "a few days ago":
        return day - timedelta(days=3)
    if rel == "last week":
        return day - timedelta(days=7)
    return day - timedelta(days=14)


# -- the data set, statistics and the file --------------------------------------------------------------------


def build_dataset(seed: int = SEED, conversations: int = CONVERSATIONS, sessions: int | None = None) -> dict[str, Any]:
    """`conversations` conversations; the first half (rounded up) is the tuning split, the rest the test split."""
    convs = [build_conversation(seed, i, sessions) for i in range(conversations)]
    tuning = (conversations + 1) // 2
    for number, conv in enumerate(convs):
        conv["split"] = "tuning" if number < tuning else "test"
        for session in conv["sessions"]:
            for turn in session["turns"]:
                turn.pop("tags", None)
    return {"description": (
        "Synthetic multi-session conversations between two friends for amfs-server's conversational retrieval "
        "benchmark: every turn is one memory (entity_path = conversation_id, key = turn key, value = "
        "'<speaker>: <text>'); questions carry the keys of their evidence turns. Generated by "
        "session_bench/make_conversation_dataset.py; the split is by conversation."),
        "seed": seed, "conversations": convs}


STOP_WORDS = set("""a an the and or but if of to in on at for with by from as is are was were be been being am do does did
doing have has had having i me my we our you your he him his she her it its they them their what which who whom whose
when where why how this that these those there here so too very can could would should will just not no yes than then
about into over after before up down out off again once all any both each few more most other some such only own same
s t don now also get got go went like really much many one two let ok oh""".split())


def content_words(text: str) -> set[str]:
    return {stem(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP_WORDS and len(w) > 1}


def stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def statistics_of(dataset: dict[str, Any]) -> dict[str, Any]:
    turns = sessions = 0
    per_kind: dict[str, int] = {k: 0 for k in KINDS}
    overlap: dict[str, list[float]] = {k: [] for k in KINDS}
    overlap_no_names: dict[str, list[float]] = {k: [] for k in KINDS}
    for conv in dataset["conversations"]:
        sessions += len(conv["sessions"])
        text_of = {}
        for session in conv["sessions"]:
            for turn in session["turns"]:
                text_of[turn["key"]] = f"{turn['speaker']}: {turn['text']}"
                turns += 1
        names = {stem(n.lower()) for n in conv["speakers"]}
        for question in conv["questions"]:
            per_kind[question["kind"]] += 1
            words = content_words(question["question"])
            found = set().union(*(content_words(text_of[k]) for k in question["evidence"]))
            if words:
                overlap[question["kind"]].append(len(words & found) / len(words))
            without = words - names
            if without:
                overlap_no_names[question["kind"]].append(len(without & found) / len(without))
    n = len(dataset["conversations"])
    return {
        "conversations": n, "sessions": sessions, "turns": turns, "turns_per_conversation": turns / n,
        "sessions_per_conversation": sessions / n, "questions": sum(per_kind.values()), "questions_per_kind": per_kind,
        "overlap_per_kind": {k: round(statistics.fmean(v), 3) for k, v in overlap.items() if v},
        "overlap_per_kind_without_names": {k: round(statistics.fmean(v), 3) for k, v in overlap_no_names.items() if v},
        "overlap_overall": round(statistics.fmean([x for v in overlap.values() for x in v]), 3),
        "overlap_overall_without_names": round(statistics.fmean([x for v in overlap_no_names.values() for x in v]), 3),
    }


def validate(dataset: dict[str, Any]) -> None:
    ids = set()
    for conv in dataset["conversations"]:
        keys = [t["key"] for s in conv["sessions"] for t in s["turns"]]
        if len(keys) != len(set(keys)):
            raise ValueError(f"{conv['conversation_id']}: duplicate turn keys")
        for question in conv["questions"]:
            if question["id"] in ids:
                raise ValueError(f"duplicate question id {question['id']}")
            ids.add(question["id"])
            missing = set(question["evidence"]) - set(keys)
            if missing or not question["evidence"]:
                raise ValueError(f"{question['id']}: evidence {sorted(missing)} not in the conversation")


def render(dataset: dict[str, Any]) -> str:
    return json.dumps(dataset, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs from a fresh build")
    parser.add_argument("--stats", action="store_true", help="print statistics only; write nothing")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--conversations", type=int, default=CONVERSATIONS)
    parser.add_argument("--out", type=Path, default=OUT_PATH)
    args = parser.parse_args(argv)
    dataset = build_dataset(args.seed, args.conversations)
    validate(dataset)
    print(json.dumps(statistics_of(dataset), indent=2))
    text = render(dataset)
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run python session_bench/make_conversation_dataset.py", file=sys.stderr)
            return 1
        return 0
    if not args.stats:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(text) / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
